//go:build !nodemo

package main

import (
	"context"
	"log/slog"

	"github.com/llmlanes/llmlanes/internal/demo"
	"github.com/llmlanes/llmlanes/internal/exporter"
)

// startDemo runs --demo: the simulator, the exporter and the load. Builds
// with the nodemo tag leave it, and the simulator, out.
func startDemo(addr string, log *slog.Logger, o exporter.Options, gateway string) (*exporter.Listener, func(context.Context) error, error) {
	o.Log = log
	d, err := demo.StartGateway(addr, o, gateway)
	if err != nil {
		return nil, nil, err
	}
	return d.Listener, d.Stop, nil
}
