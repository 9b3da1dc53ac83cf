//go:build nodemo

package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/llmlanes/llmlanes/internal/exporter"
)

// startDemo refuses --demo: this build (tag nodemo, as production builds
// are made) has no simulator in it.
func startDemo(string, *slog.Logger, exporter.Options, string) (*exporter.Listener, func(context.Context) error, error) {
	return nil, nil, errors.New("--demo is not in this build (built with -tags nodemo); use a default build, or `make demo`")
}
