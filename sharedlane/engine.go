package sharedlane

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// laneLua is lane.lua: one lane's grant decisions, as a chunk that returns
// the function running one op (see its head).
//
//go:embed lane.lua
var laneLua string

// engine runs lane.lua's ops on Redis. It loads lane.lua as a function
// library (Redis 7 and later), so that the script's sixty-odd functions
// are made once, at the load, rather than on every call: making them cost
// more than all the rest of an uncontended acquire (docs/BENCHMARKS.md).
// A Redis that has no functions, or refuses FUNCTION LOAD, runs lane.lua
// as a script (EVALSHA) instead, with the same answers.
//
// The library's name carries a hash of lane.lua, so that processes of two
// versions, in a rolling upgrade, each call their own; an older version's
// library stays loaded, a few kilobytes, until FUNCTION DELETE.
type engine struct {
	fn     string        // the function's name
	fnArg  any           // fn, boxed once
	lib    string        // the library's source, for FUNCTION LOAD
	script *redis.Script // lane.lua as a script, for a Redis without functions
	eval   atomic.Bool   // run the script: Redis has no functions
	log    *slog.Logger
}

func newEngine(log *slog.Logger) *engine {
	sum := sha256.Sum256([]byte(laneLua))
	v := hex.EncodeToString(sum[:6])
	// Both wrap the chunk in a function: a library runs it once, at the
	// load, and registers the lane function it returns; a script runs it,
	// and the function, on every call. The wrapping keeps lane.lua's line
	// numbers (one more for the library's first line) in Redis' errors.
	return &engine{
		fn:     "llmlanes_lane_" + v,
		fnArg:  "llmlanes_lane_" + v,
		lib:    "#!lua name=llmlanes_" + v + "\nredis.register_function('llmlanes_lane_" + v + "', (function() " + laneLua + "\nend)())\n",
		script: redis.NewScript("return (function() " + laneLua + "\nend)()(KEYS, ARGV)\n"),
		log:    log,
	}
}

// run runs one op on keys. A Redis that lost the library (a
// restart with no persistence, FUNCTION FLUSH, a new cluster node) gets it
// again, and the op is sent once more.
//
// fcall builds the whole FCALL of function fn ("fcall", fn, the number of
// keys, the keys, the arguments); the script is run with what follows the
// keys.
func (e *engine) run(ctx context.Context, rdb redis.UniversalClient, keys []string, fcall func(fn any) []any) *redis.Cmd {
	if !e.eval.Load() {
		cmd := e.fcall(ctx, rdb, fcall)
		if !e.missing(cmd.Err()) {
			return cmd
		}
		if err := e.load(ctx, rdb); err != nil {
			cmd.SetErr(err)
			return cmd
		}
		if !e.eval.Load() {
			return e.fcall(ctx, rdb, fcall)
		}
	}
	return e.script.Run(ctx, rdb, keys, fcall(e.fnArg)[3+len(keys):]...)
}

// fcall runs the FCALL that fcall builds (the keys boxed once per lane,
// not per call as go-redis' FCall boxes them), with its first key third,
// for a cluster's routing.
func (e *engine) fcall(ctx context.Context, rdb redis.UniversalClient, fcall func(fn any) []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, fcall(e.fnArg)...)
	cmd.SetFirstKeyPos(3)
	_ = rdb.Process(ctx, cmd)
	return cmd
}

// pipelined runs one op per key set of keys in one pipeline (one round
// trip; a Cluster splits it by node), args(i) giving the i-th's arguments.
// The library, or the script, is loaded first if Redis does not have it.
func (e *engine) pipelined(ctx context.Context, rdb redis.UniversalClient, keys [][]string, args func(i int) []any) ([]*redis.Cmd, error) {
	for attempt := 0; ; attempt++ {
		eval := e.eval.Load()
		pipe := rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(keys))
		for i, k := range keys {
			if eval {
				cmds[i] = e.script.EvalSha(ctx, pipe, k, args(i)...)
			} else {
				cmds[i] = pipe.FCall(ctx, e.fn, k, args(i)...)
			}
		}
		_, err := pipe.Exec(ctx)
		if err == nil || attempt > 0 {
			return cmds, err
		}
		switch {
		case eval && strings.Contains(err.Error(), "NOSCRIPT"):
			err = e.script.Load(ctx, rdb).Err()
		case !eval && e.missing(err):
			err = e.load(ctx, rdb)
		default:
			return cmds, err
		}
		if err != nil {
			return cmds, err
		}
	}
}

// missing reports whether err says that Redis lacks the function (load
// it), or lacks functions altogether (FCALL unknown: use the script).
func (e *engine) missing(err error) bool {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return false
	}
	msg := err.Error()
	if strings.Contains(msg, "unknown command") {
		e.useScript(err)
		return true
	}
	return strings.Contains(msg, "Function not found")
}

// load loads the library on every primary.
func (e *engine) load(ctx context.Context, rdb redis.UniversalClient) error {
	loadOn := func(ctx context.Context, c *redis.Client) error { return c.FunctionLoadReplace(ctx, e.lib).Err() }
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, loadOn)
	} else {
		err = rdb.FunctionLoadReplace(ctx, e.lib).Err()
	}
	var re redis.Error
	if errors.As(err, &re) {
		// Redis answered, and said no: no functions (before 7.0), or not
		// for this user (an ACL without @scripting's FUNCTION).
		e.useScript(err)
		return nil
	}
	return err
}

func (e *engine) useScript(why error) {
	if !e.eval.Swap(true) {
		e.log.Warn("sharedlane: Redis does not load lane.lua as a function library; it runs as a script, slower (docs/BENCHMARKS.md)",
			"err", why.Error())
	}
}
