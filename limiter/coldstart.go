package limiter

import "time"

// coldStart is a lane made under Config.ColdStart that has not heard from
// its gateway: it grants one call at a time until an answer, a first byte
// or the provider's headers come, or until ColdStartMax has passed (a hung
// first call), then is its inner policy. A reload that turns ColdStart off
// ends it.
type coldStart struct {
	until time.Time
	inner limitPolicy
	eff   Config // effective's result, so that deciding allocates nothing
}

func (c *coldStart) effective(cfg *Config) *Config {
	c.eff = *c.inner.effective(cfg)
	c.eff.MaxInflight = min(1, cfg.MaxInflight)
	return &c.eff
}

func (c *coldStart) reconfigured(cfg *Config, now time.Time) limitPolicy {
	c.inner = c.inner.reconfigured(cfg, now)
	if !cfg.ColdStart {
		return c.inner
	}
	return c
}

func (c *coldStart) answered() limitPolicy      { return c.inner }
func (c *coldStart) warmsAt() (time.Time, bool) { return c.until, true }

func (c *coldStart) held(clock Clock, inflight int, interactive bool) {
	c.inner.held(clock, inflight, interactive)
}

func (c *coldStart) firstByte(now time.Time, fb FirstByte, inflight, reserve int, busy bool) bool {
	return c.inner.firstByte(now, fb, inflight, reserve, busy)
}

func (c *coldStart) loss(now time.Time, x *Exchange) { c.inner.loss(now, x) }

func (c *coldStart) drainReserve(cfg *Config, inflight, others int) bool {
	return c.inner.drainReserve(cfg, inflight, others)
}

func (c *coldStart) settleDrain(cfg *Config, others int) { c.inner.settleDrain(cfg, others) }

func (c *coldStart) state(cfg *Config, now time.Time) (bool, *AdaptiveState) {
	_, a := c.inner.state(cfg, now)
	return true, a
}
