package lanehttp

import (
	"bytes"
	"encoding/json"

	"github.com/llmlanes/llmlanes/limiter"
)

// usageKey is what usageScan looks for in a response body.
var usageKey = []byte(`"usage"`)

// maxUsageBytes bounds the usage object usageScan keeps: OpenAI's, with its
// details, is about 300 bytes.
const maxUsageBytes = 1024

// usageScan reads a model call's response body as it passes, for what the
// call cost: the "usage" objects in it (OpenAI's prompt_tokens and
// completion_tokens, or input_tokens and output_tokens as the Responses
// API and Anthropic's Messages send them; in a stream, the chunk with
// usage, or Anthropic's message_start and message_delta), and, for a
// stream that carries none, its events. It keeps at most maxUsageBytes
// and allocates nothing after the first usage object.
type usageScan struct {
	// partial counts the bytes of usageKey matched at the end of the last
	// chunk, so that a key split between two reads is found.
	partial int
	// capturing is set from the key to the end of its object, collected
	// in obj (depth: its braces open; inString, esc: inside a string).
	capturing, inString, esc bool
	depth                    int
	obj                      []byte
	// prompt and completion are the largest seen (-1: none): Anthropic's
	// message_delta counts the output so far.
	prompt, completion int64
	events             int64 // "data:" lines, for a stream without usage
	bytes              int64
}

func newUsageScan() usageScan { return usageScan{prompt: -1, completion: -1} }

// feed reads the next bytes of the body.
func (u *usageScan) feed(p []byte) {
	u.bytes += int64(len(p))
	u.events += int64(bytes.Count(p, []byte("data:")))
	for len(p) > 0 {
		if u.capturing {
			p = u.capture(p)
			continue
		}
		if u.partial > 0 {
			// The key began in the last chunk: go on matching it here.
			n := min(len(usageKey)-u.partial, len(p))
			if bytes.Equal(p[:n], usageKey[u.partial:u.partial+n]) {
				if u.partial += n; u.partial == len(usageKey) {
					u.partial, u.capturing, u.depth, u.obj = 0, true, 0, u.obj[:0]
				}
				p = p[n:]
				continue
			}
			u.partial = 0
		}
		i := bytes.Index(p, usageKey)
		if i < 0 {
			// Keep the longest tail of p that begins the key.
			for k := min(len(usageKey)-1, len(p)); k > 0; k-- {
				if bytes.Equal(p[len(p)-k:], usageKey[:k]) {
					u.partial = k
					break
				}
			}
			return
		}
		u.capturing, u.depth, u.obj = true, 0, u.obj[:0]
		p = p[i+len(usageKey):]
	}
}

// capture collects the usage object from p and returns what follows it.
func (u *usageScan) capture(p []byte) []byte {
	for i, c := range p {
		if u.depth == 0 {
			switch c {
			case ' ', '\t', '\n', '\r', ':':
				continue
			case '{':
			default: // null, or not an object: not a usage
				u.capturing = false
				return p[i:]
			}
		}
		if len(u.obj) < maxUsageBytes {
			u.obj = append(u.obj, c)
		}
		switch {
		case u.inString:
			if u.esc {
				u.esc = false
			} else if c == '\\' {
				u.esc = true
			} else if c == '"' {
				u.inString = false
			}
		case c == '"':
			u.inString = true
		case c == '{':
			u.depth++
		case c == '}':
			if u.depth--; u.depth == 0 {
				u.capturing = false
				u.read(u.obj)
				return p[i+1:]
			}
		}
	}
	return nil
}

// read takes the counts of one usage object.
func (u *usageScan) read(obj []byte) {
	if len(obj) == maxUsageBytes || !json.Valid(obj) {
		// Cut, or not JSON (a gateway's bug or a lie): not to be trusted,
		// and the skip functions below walk only valid JSON.
		return
	}
	i := skipSpace(obj, 1)
	var buf keyBuf
	for i < len(obj) && obj[i] != '}' {
		if obj[i] != '"' {
			return
		}
		k := i
		i = skipString(obj, i)
		key := keyName(obj[k:i], &buf)
		i = skipSpace(obj, i)
		i = skipSpace(obj, i+1)
		v := i
		i = skipValue(obj, i)
		if n := intValue(obj[v:i]); n >= 0 {
			switch string(key) {
			case "prompt_tokens", "input_tokens":
				u.prompt = max(u.prompt, n)
			case "completion_tokens", "output_tokens":
				u.completion = max(u.completion, n)
			}
		}
		i = skipSpace(obj, i)
		if i < len(obj) && obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
	}
}

// settle returns what a call estimated at est cost, from what its answer
// (of status, a stream or not) said or carried.
//
// With a usage, its counts (a count it left out is the estimate's
// prompt, or 0 for the output). Without one: for an error answer, nothing
// (the provider served nothing); otherwise the estimated prompt, and as
// output an event a token for a stream (OpenAI's and compatible servers
// send about one token a chunk), or for a whole answer its bytes at 4 a
// token.
//
// Each count is at most limiter.MaxCallTokens, whatever the answer says
// (the lane bounds it again by its budgets: limiter.BoundUsage).
func (u *usageScan) settle(est Estimate, status int, stream bool) (limiter.Usage, bool) {
	if u.prompt >= 0 || u.completion >= 0 {
		r := limiter.Usage{Prompt: u.prompt, Completion: max(u.completion, 0)}
		if r.Prompt < 0 {
			r.Prompt = est.Prompt
		}
		r.Prompt, r.Completion = min(r.Prompt, limiter.MaxCallTokens), min(r.Completion, limiter.MaxCallTokens)
		return r, true
	}
	if status >= 400 {
		return limiter.Usage{}, false
	}
	r := limiter.Usage{Prompt: min(est.Prompt, limiter.MaxCallTokens)}
	if stream {
		r.Completion = u.events
	} else {
		r.Completion = (u.bytes + 3) / 4
	}
	r.Completion = min(r.Completion, limiter.MaxCallTokens)
	return r, false
}
