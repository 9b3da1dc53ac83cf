package lanehttp

import (
	"net/http"
	"testing"
	"time"
)

func TestStatedTimeout(t *testing.T) {
	for _, c := range []struct {
		h    map[string]string
		want time.Duration
		ok   bool
	}{
		{map[string]string{}, 0, false},
		{map[string]string{"X-LLM-Timeout": "2.5"}, 2500 * time.Millisecond, true},
		{map[string]string{"X-LLM-Timeout": "2", "X-Stainless-Timeout": "9"}, 2 * time.Second, true},
		{map[string]string{"X-Stainless-Timeout": "6", "X-Stainless-Read-Timeout": "600.0"}, 6 * time.Second, true},
		{map[string]string{"X-Stainless-Read-Timeout": "600.0"}, 600 * time.Second, true},
		{map[string]string{"X-LLM-Timeout": "NaN", "X-Stainless-Timeout": "4"}, 4 * time.Second, true},
		{map[string]string{"X-LLM-Timeout": "-3"}, 0, false},
		{map[string]string{"X-LLM-Timeout": "0"}, 0, false},
		{map[string]string{"X-LLM-Timeout": "1e300"}, 0, false},
		{map[string]string{"X-LLM-Timeout": "Inf"}, 0, false},
		{map[string]string{"X-LLM-Timeout": "ten"}, 0, false},
		{map[string]string{"X-LLM-Timeout": "0x10"}, 0, false},
		{map[string]string{"X-LLM-Timeout": "1" + string(make([]byte, 40))}, 0, false},
	} {
		h := http.Header{}
		for k, v := range c.h {
			h.Set(k, v)
		}
		if got, ok := StatedTimeout(h); got != c.want || ok != c.ok {
			t.Errorf("%v: got %s %v, want %s %v", c.h, got, ok, c.want, c.ok)
		}
	}
}
