package lanehttp

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// keyName reads a key as encoding/json does, where the result can be one
// of the short ASCII names the package looks for, and says nil otherwise.
func TestKeyNameMatchesEncodingJSON(t *testing.T) {
	keys := []string{
		`"model"`, `"mod\u0065l"`, `"\u006D\u006f\u0064\u0065\u006C"`, `"max_tokens"`,
		`"max\u005ftokens"`, `"n"`, `"\u006e"`, `"a\"b"`, `"a\\b"`, `"a\/b"`,
		`"\b\f\n\r\t"`, `"\u0000"`, `"\u007f"`, `"\u0080"`, `"\u00e9"`, `"é"`,
		`"\ud83d\ude00"`, `""`, `"\u0061\u0062\u0063\u0064\u0065\u0066\u0067\u0068\u0069\u006a\u006b\u006c\u006d\u006e\u006f\u0070\u0071\u0072\u0073\u0074\u0075\u0076\u0077\u0078\u0079\u007a\u0061\u0062\u0063\u0064\u0065\u0066"`,
		`"\u0061\u0062\u0063\u0064\u0065\u0066\u0067\u0068\u0069\u006a\u006b\u006c\u006d\u006e\u006f\u0070\u0071\u0072\u0073\u0074\u0075\u0076\u0077\u0078\u0079\u007a\u0061\u0062\u0063\u0064\u0065\u0066\u0067"`,
	}
	for _, k := range keys {
		var want string
		if err := json.Unmarshal([]byte(k), &want); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		var buf keyBuf
		kb := []byte(k)
		got := keyName(kb, &buf)
		ascii := true
		for i := 0; i < len(want); i++ {
			ascii = ascii && want[i] < utf8.RuneSelf
		}
		switch {
		case ascii && len(want) <= len(buf):
			if got == nil || string(got) != want {
				t.Errorf("keyName(%s) = %q, encoding/json reads %q", k, got, want)
			}
		case got != nil && string(got) == want:
			// A key without escapes is itself, whatever its length.
		case got != nil:
			t.Errorf("keyName(%s) = %q; encoding/json reads %q, which is no short ASCII name", k, got, want)
		}
		if n := testing.AllocsPerRun(10, func() { keyName(kb, &buf) }); n != 0 {
			t.Errorf("keyName(%s) allocates %v times", k, n)
		}
	}
}
