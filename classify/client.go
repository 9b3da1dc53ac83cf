package classify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Path is where lanes-exporter (and any server built on package telemetry)
// serves the classification.
const Path = "/api/telemetry/llm-lanes/classification"

// Errors a Client's lookups wrap.
var (
	// ErrNotFound: no such lane, or no such upstream.
	ErrNotFound = errors.New("classify: not found")
	// ErrDisabled: the limiter is off (max_inflight 0): calls pass straight
	// through and no lane has a state.
	ErrDisabled = errors.New("classify: the limiter is off")
)

// maxAnswer bounds an answer read by a Client.
const maxAnswer = 32 << 20

// Client reads the classification of a lanes-exporter (or of any process
// that serves package telemetry's routes).
type Client struct {
	// BaseURL is the server's address, such as http://127.0.0.1:4470.
	BaseURL string
	// HTTP sends the requests; nil means http.DefaultClient.
	HTTP *http.Client
}

// Report returns every lane's classification.
func (c *Client) Report(ctx context.Context) (*Report, error) {
	var r Report
	if err := c.get(ctx, nil, &r); err != nil {
		return nil, err
	}
	if !r.Enabled {
		return &r, ErrDisabled
	}
	return &r, nil
}

// Lane returns the classification of the lane named key (for another
// process's lane, pass target as well; "" for the server's own).
func (c *Client) Lane(ctx context.Context, key, target string) (*Classification, error) {
	q := url.Values{"lane": {key}}
	if target != "" {
		q.Set("target", target)
	}
	return c.one(ctx, q)
}

// Model returns the classification of the lane of model at the configured
// upstream named upstream: state idle if it has had no call yet.
func (c *Client) Model(ctx context.Context, upstream, model string) (*Classification, error) {
	return c.one(ctx, url.Values{"upstream": {upstream}, "model": {model}})
}

func (c *Client) one(ctx context.Context, q url.Values) (*Classification, error) {
	var raw json.RawMessage
	if err := c.get(ctx, q, &raw); err != nil {
		return nil, err
	}
	var probe struct {
		Enabled *bool `json:"enabled"`
	}
	if json.Unmarshal(raw, &probe) == nil && probe.Enabled != nil && !*probe.Enabled {
		return nil, ErrDisabled
	}
	var cl Classification
	if err := json.Unmarshal(raw, &cl); err != nil {
		return nil, fmt.Errorf("classify: %w", err)
	}
	return &cl, nil
}

// get fetches the route with query q into v, checking the status and the
// payload's version.
func (c *Client) get(ctx context.Context, q url.Values, v any) error {
	u := strings.TrimRight(c.BaseURL, "/") + Path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("classify: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("classify: %w", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("classify: reading the answer: %w", err)
	}
	var head struct {
		Version int    `json:"version"`
		Error   string `json:"error"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return fmt.Errorf("classify: %s answered %s, not the classification JSON: %w", u, res.Status, err)
	}
	switch {
	case res.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w: %s", ErrNotFound, head.Error)
	case res.StatusCode != http.StatusOK:
		return fmt.Errorf("classify: %s answered %s: %s", u, res.Status, head.Error)
	case head.Version != Version:
		return fmt.Errorf("classify: payload version %d, this client reads version %d", head.Version, Version)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("classify: %w", err)
	}
	return nil
}
