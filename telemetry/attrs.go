package telemetry

import "go.opentelemetry.io/otel/attribute"

func laneAttr(lane string) attribute.KeyValue { return attribute.String("lane", lane) }
func stateAttr(s State) attribute.KeyValue    { return attribute.String("state", string(s)) }
