package otelbridge_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/llmlanes/llmlanes/limiter"
	"github.com/llmlanes/llmlanes/otelbridge"
)

// TestTenantSeriesBound: the tenant metrics report at most MaxTenantSeries
// (lane, tenant) pairs by name across all lanes, the first seen, and keep
// them while their lane tracks the tenant; a lane's others are summed as
// "other", whose service counter never goes back, even as tenants leave
// the sum; a pair whose tenant the lane forgot frees its place.
func TestTenantSeriesBound(t *testing.T) {
	b, err := otelbridge.New(otelbridge.Options{TracerProvider: tracenoop.NewTracerProvider(), MaxTenantSeries: 4})
	if err != nil {
		t.Fatal(err)
	}
	var lanes []limiter.LaneSnapshot
	b.UseSnapshots(func() limiter.Snapshot { return limiter.Snapshot{Lanes: lanes} })
	lane := func(name string, tenants ...limiter.TenantSnapshot) limiter.LaneSnapshot {
		return limiter.LaneSnapshot{Lane: name, AllTenants: tenants}
	}
	tn := func(name string, service float64) limiter.TenantSnapshot {
		return limiter.TenantSnapshot{Tenant: name, Service: limiter.Seconds(service), Inflight: 1, Weight: 1}
	}
	// scrape returns the tenant service series, "lane/tenant=service".
	scrape := func() []string {
		t.Helper()
		var out []string
		if m, ok := produced(t, b, "llm.tenant.service"); ok {
			for _, p := range m.(metricdata.Sum[float64]).DataPoints {
				l, _ := p.Attributes.Value("lane")
				te, _ := p.Attributes.Value("tenant")
				out = append(out, fmt.Sprintf("%s/%s=%g", l.AsString(), te.AsString(), p.Value))
			}
		}
		slices.Sort(out)
		return out
	}
	expect := func(step string, want ...string) {
		t.Helper()
		if got := scrape(); !slices.Equal(got, want) {
			t.Fatalf("%s: series %v, want %v", step, got, want)
		}
	}
	lanes = []limiter.LaneSnapshot{lane("L1", tn("a", 1), tn("b", 2), tn("c", 3)), lane("L2", tn("d", 4), tn("e", 5))}
	expect("first", "L1/a=1", "L1/b=2", "L1/c=3", "L2/d=4", "L2/other=5")
	// A busier tenant of L2 does not take d's series: the pairs seen first
	// keep theirs.
	lanes = []limiter.LaneSnapshot{lane("L1", tn("a", 1), tn("b", 2), tn("c", 3)), lane("L2", tn("e", 9), tn("d", 4), tn("f", 1))}
	expect("sticky", "L1/a=1", "L1/b=2", "L1/c=3", "L2/d=4", "L2/other=10")
	// L1 forgets c: its place goes to the next pair, L2's e, which leaves
	// the sum; the sum keeps what e received while in it.
	lanes = []limiter.LaneSnapshot{lane("L1", tn("a", 1), tn("b", 2)), lane("L2", tn("e", 9), tn("d", 4), tn("f", 2))}
	expect("freed", "L1/a=1", "L1/b=2", "L2/d=4", "L2/e=9", "L2/other=11")
	// The lane's own "other" (past max_tenants) is summed too, never named.
	lanes = []limiter.LaneSnapshot{lane("L1", tn("a", 1), tn("b", 2), tn(limiter.OtherTenant, 5)), lane("L2", tn("e", 9), tn("d", 4), tn("f", 2))}
	expect("other", "L1/a=1", "L1/b=2", "L1/other=5", "L2/d=4", "L2/e=9", "L2/other=11")
	// A tenant forgotten and back starts again from 0: the sum takes what
	// it received since.
	lanes = []limiter.LaneSnapshot{lane("L1", tn("a", 1), tn("b", 2), tn(limiter.OtherTenant, 5)), lane("L2", tn("e", 9), tn("d", 4), tn("f", 1))}
	expect("restarted", "L1/a=1", "L1/b=2", "L1/other=5", "L2/d=4", "L2/e=9", "L2/other=12")
}

// A named tenant idle for 5 minutes gives its name up to an active tenant
// that has none: one caller that took the names with a burst and went
// quiet does not keep the honest tenants unnamed. A tenant idle for less,
// or an unnamed tenant that is idle itself, changes nothing.
func TestTenantSeriesIdleGiveUpTheirNames(t *testing.T) {
	b, err := otelbridge.New(otelbridge.Options{TracerProvider: tracenoop.NewTracerProvider(), MaxTenantSeries: 2})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	var snap limiter.Snapshot
	b.UseSnapshots(func() limiter.Snapshot { return snap })
	tn := func(name string, service float64, inflight, queued int) limiter.TenantSnapshot {
		return limiter.TenantSnapshot{Tenant: name, Service: limiter.Seconds(service), Inflight: inflight, Queued: queued, Weight: 1}
	}
	at := func(d time.Duration, tenants ...limiter.TenantSnapshot) []string {
		t.Helper()
		snap = limiter.Snapshot{GeneratedAt: t0.Add(d), Lanes: []limiter.LaneSnapshot{{Lane: "L", AllTenants: tenants}}}
		var out []string
		if m, ok := produced(t, b, "llm.tenant.inflight"); ok {
			for _, p := range m.(metricdata.Gauge[int64]).DataPoints {
				te, _ := p.Attributes.Value("tenant")
				out = append(out, te.AsString())
			}
		}
		slices.Sort(out)
		return out
	}
	if got := at(0, tn("liar1", 1, 1, 0), tn("liar2", 1, 1, 0), tn("honest", 0, 0, 1)); !slices.Equal(got, []string{"liar1", "liar2", "other"}) {
		t.Fatalf("at first: %v", got)
	}
	// The liars go quiet; a minute later the honest tenant is still unnamed.
	if got := at(time.Minute, tn("liar1", 1, 0, 0), tn("liar2", 1, 0, 0), tn("honest", 0, 0, 1)); !slices.Equal(got, []string{"liar1", "liar2", "other"}) {
		t.Fatalf("a minute on: %v", got)
	}
	// An idle unnamed tenant takes no name, however long the others idle.
	if got := at(6*time.Minute, tn("liar1", 1, 0, 0), tn("liar2", 1, 0, 0), tn("honest", 0, 0, 0)); !slices.Equal(got, []string{"liar1", "liar2", "other"}) {
		t.Fatalf("six minutes on, all idle: %v", got)
	}
	// Active again, it takes the name of one liar idle for 5 minutes.
	got := at(7*time.Minute, tn("liar1", 1, 0, 0), tn("liar2", 1, 0, 0), tn("honest", 0, 1, 0))
	if len(got) != 3 || !slices.Contains(got, "honest") || !slices.Contains(got, "other") {
		t.Fatalf("seven minutes on: %v, want honest named beside one liar and other", got)
	}
}

// produced returns the data of the metric named name that b produces now.
func produced(t *testing.T, b *otelbridge.Bridge, name string) (metricdata.Aggregation, bool) {
	t.Helper()
	sms, err := b.Produce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, sm := range sms {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m.Data, true
			}
		}
	}
	return nil, false
}
