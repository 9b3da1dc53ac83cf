// Package leaktest checks that a package's tests leave no goroutine
// behind, as goleak.VerifyTestMain does, with a bound that does not depend
// on how loaded the machine is.
//
// goleak retries for about two seconds before it calls a goroutine leaked;
// on a machine running two race-enabled suites at once, a connection's
// goroutines can take longer than that to notice that the server at the
// other end closed it. VerifyTestMain closes the default transport's idle
// connections, then looks again for up to ten seconds: a goroutine that is
// on its way out is gone by then, a leaked one is still there.
package leaktest

import (
	"fmt"
	"net/http"
	"os"
	"time"

	"go.uber.org/goleak"
)

// Grace is how long VerifyTestMain waits for goroutines to end.
const Grace = 10 * time.Second

// M is what VerifyTestMain needs of a *testing.M (the package imports
// testing nowhere but in tests).
type M interface{ Run() int }

// VerifyTestMain runs the tests and, if they pass, fails the binary when
// goroutines other than those opts ignore are still running after Grace.
// Call it from TestMain; it does not return.
func VerifyTestMain(m M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		if err := Check(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Check returns goleak's error if goroutines are still running after Grace.
func Check(opts ...goleak.Option) error {
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	deadline := time.Now().Add(Grace)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
