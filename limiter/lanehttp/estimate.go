package lanehttp

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
)

// DefaultMaxOutputTokens is the output bound of a call that names none,
// when Transport.DefaultMaxOutputTokens is 0.
const DefaultMaxOutputTokens = 1024

// imageTokens is what an inline image (a data: URL) counts for: about what
// OpenAI charges a high-detail image of 1024x1024 and Anthropic one of
// about 750x750, where counting its base64 bytes as text would count
// hundreds of thousands.
const imageTokens = 1000

// Estimate is what a model call is estimated to cost, in tokens, before it
// is sent.
type Estimate struct {
	// Prompt is the estimate of the prompt's tokens: every string value of
	// the body (messages, tools, input, system, instructions...) at about
	// 4 bytes of text a token, a byte beyond ASCII at half a token, plus
	// one token a string for its framing; a data: URL counts 1,000.
	Prompt int64
	// Output is the most the call may write: max_completion_tokens, else
	// max_tokens, else max_output_tokens, else the default; times n.
	Output int64
	// Open is set when the body names no output bound: Output is the
	// default's, and the lane estimates the call at what it has learned
	// such calls write (limiter.WithOpenOutput).
	Open bool
	// Stream is set when the body asks for a streamed answer
	// ("stream": true).
	Stream bool
}

// Total returns Prompt plus Output, at most math.MaxInt64: a call that
// asks for more than limiter.MaxCallTokens is refused by the lane.
func (e Estimate) Total() int64 {
	if e.Output > math.MaxInt64-e.Prompt {
		return math.MaxInt64
	}
	return e.Prompt + e.Output
}

// EstimateTokens estimates the cost of the model call whose body is body,
// a JSON object known to be valid (ModelOf has accepted it), with
// defaultOutput the output bound of a call that names none. It reads the
// bytes once and allocates nothing.
//
// It is an estimate, not a tokenizer: the models' tokenizers differ
// (OpenAI's o200k and cl100k, Anthropic's, a self-hosted model's own), a
// vocabulary would make this package depend on more than the standard
// library, and the lane settles every call against the usage its answer
// reports. How far off it is shows as the lane's estimate error (the
// snapshot's tokens.estimate_error_5m).
func EstimateTokens(body []byte, defaultOutput int64) Estimate {
	e, _, _ := estimate(body, defaultOutput)
	return e
}

// estimate is EstimateTokens, and the value of the body's last "model" key
// (found: there was one), read on the way.
func estimate(body []byte, defaultOutput int64) (e Estimate, model []byte, found bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return e, nil, false
	}
	var maxCompletion, maxTokens, maxOutput, n int64 = -1, -1, -1, 1
	var buf keyBuf
	for i = skipSpace(body, i+1); i < len(body) && body[i] != '}'; {
		k := i
		i = skipString(body, i)
		key := keyName(body[k:i], &buf) // decoded once, whatever its escapes
		i = skipSpace(body, i)
		i = skipSpace(body, i+1) // the colon
		v := i
		switch string(key) {
		case "max_completion_tokens":
			i = skipValue(body, i)
			maxCompletion = intValue(body[v:i])
		case "max_tokens":
			i = skipValue(body, i)
			maxTokens = intValue(body[v:i])
		case "max_output_tokens":
			i = skipValue(body, i)
			maxOutput = intValue(body[v:i])
		case "n":
			i = skipValue(body, i)
			n = min(max(intValue(body[v:i]), 1), 128)
		case "model":
			i = skipValue(body, i)
			model, found = body[v:i], true
		case "stream":
			i = skipValue(body, i)
			e.Stream = string(body[v:i]) == "true"
		case "stream_options", "user", "metadata", "response_format", "tool_choice", "reasoning_effort":
			i = skipValue(body, i) // settings, not prompt
		default:
			var t int64
			i, t = scanValue(body, i)
			e.Prompt += t
		}
		i = skipSpace(body, i)
		if i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	out := defaultOutput
	switch {
	case maxCompletion >= 0:
		out = maxCompletion
	case maxTokens >= 0:
		out = maxTokens
	case maxOutput >= 0:
		out = maxOutput
	default:
		e.Open = true
	}
	// Saturating: max_tokens 999999999999999999 with n 10 is a call too
	// large for any lane, not a negative one that fits every budget.
	if out > math.MaxInt64/n {
		e.Output = math.MaxInt64
	} else {
		e.Output = out * n
	}
	return e, model, found
}

// scanValue returns the index just past the JSON value that starts at
// b[i], and the estimated tokens of its string values (object keys left
// out). It walks the value once; strings are skipped with
// bytes.IndexByte, which is what keeps a long prompt cheap.
func scanValue(b []byte, i int) (int, int64) {
	if c := b[i]; c != '"' && c != '{' && c != '[' {
		return skipValue(b, i), 0 // a number, true, false or null
	}
	var t int64
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			end := endOfString(b, i)
			if j := skipSpace(b, end); j >= len(b) || b[j] != ':' { // not a key
				t += stringTokens(b[i+1 : end-1])
			}
			if depth == 0 {
				return end, t
			}
			i = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i + 1, t
			}
		}
	}
	return i, t
}

// endOfString returns the index just past the string that starts at b[i].
func endOfString(b []byte, i int) int {
	for j := i + 1; ; j++ {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return len(b)
		}
		j += k
		escapes := 0
		for p := j - 1; p > i && b[p] == '\\'; p-- {
			escapes++
		}
		if escapes%2 == 0 {
			return j + 1
		}
	}
}

// stringTokens estimates the tokens of one string's bytes s: a byte
// beyond ASCII counts twice, 4 a token, plus one for its framing; a data:
// URL counts imageTokens.
func stringTokens(s []byte) int64 {
	if len(s) > 5 && string(s[:5]) == "data:" {
		return imageTokens
	}
	units := int64(len(s))
	j := 0
	for ; j+8 <= len(s); j += 8 {
		units += int64(bits.OnesCount64(binary.LittleEndian.Uint64(s[j:]) & 0x8080808080808080))
	}
	for ; j < len(s); j++ {
		if s[j] >= 0x80 {
			units++
		}
	}
	return (units+3)/4 + 1
}

// intValue returns the JSON integer v at least 0, at most math.MaxInt64
// (a longer one saturates), or -1 if it is not one (null, a negative or a
// fraction, say).
func intValue(v []byte) int64 {
	if len(v) == 0 {
		return -1
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return -1
		}
		if d := int64(c - '0'); n > (math.MaxInt64-d)/10 {
			n = math.MaxInt64
		} else {
			n = n*10 + d
		}
	}
	return n
}
