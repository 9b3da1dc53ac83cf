// Command benchreport runs the project's benchmarks and writes
// docs/BENCHMARKS.md: every figure, the ratios against the anchors measured
// in the same run, and each performance goal checked.
//
//	go run ./internal/tools/benchreport -out docs/BENCHMARKS.md
//
// Benchmarks are named Benchmark<Name>/<scenario>/<implementation>. In each
// scenario, every implementation is compared with the anchors present
// (x/sync/semaphore, a channel semaphore, a bare transport, a direct call).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// anchors are the implementations others are compared with.
var anchors = []string{"semaphore", "channel", "bare", "direct"}

func main() {
	out := flag.String("out", "docs/BENCHMARKS.md", "file to write")
	count := flag.Int("count", 3, "runs of each benchmark; the report takes the median")
	benchtime := flag.String("benchtime", "1s", "go test -benchtime")
	pkgs := flag.String("pkgs", "./...", "packages to benchmark")
	in := flag.String("in", "", "render this saved `go test -bench` output instead of running the benchmarks")
	proxy := flag.String("proxy", "docs/bench/proxy.json", "where the proxy-beside-HAProxy figures (internal/tools/proxybench) are kept; with -in, read from there")
	noProxy := flag.Bool("no-proxy", false, "skip the proxy-beside-HAProxy measurement")
	proxyQuick := flag.Bool("proxy-quick", false, "a short proxy-beside-HAProxy run (one round, few calls; its figures are rough)")
	flag.Parse()

	args := []string{"test", "-run", "^$", "-bench", ".", "-benchmem", "-count", strconv.Itoa(*count), "-benchtime", *benchtime}
	args = append(args, strings.Fields(*pkgs)...)
	var raw bytes.Buffer
	if *in != "" {
		b, err := os.ReadFile(*in)
		if err != nil {
			log.Fatal(err)
		}
		raw.Write(b)
	} else {
		// The date goes into the saved output too, so that rendering it
		// again later (-in) dates the figures by when they were measured.
		fmt.Fprintf(io.MultiWriter(&raw, os.Stderr), "%s%s\n", measuredOn, time.Now().UTC().Format(time.DateOnly))
		cmd := exec.Command("go", args...)
		cmd.Stdout = io.MultiWriter(&raw, os.Stderr)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			log.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
	}
	var px *proxyReport
	switch {
	case *noProxy:
	case *in != "":
		px = readProxy(*proxy)
	default:
		var err error
		if px, err = runProxy(*proxy, *proxyQuick); err != nil {
			log.Fatal(err)
		}
	}
	res, info := parse(&raw)
	var b bytes.Buffer
	report(&b, res, info, "go "+strings.Join(args, " "), px)
	if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Fprintln(os.Stderr, "wrote", *out)
}

// result is the median of each metric over the runs of one benchmark.
type result struct {
	name    string             // without the -GOMAXPROCS suffix
	metrics map[string]float64 // unit → value
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// measuredOn starts the line of the saved output that dates it.
const measuredOn = "benchreport: measured on "

// runInfo is what the output says of its run besides the figures.
type runInfo struct {
	cpu  string
	date string // YYYY-MM-DD; "" when the output does not say
}

func parse(r io.Reader) (map[string]*result, runInfo) {
	runs := map[string]map[string][]float64{}
	var order []string
	var info runInfo
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "cpu: "); ok {
			info.cpu = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, measuredOn); ok {
			info.date = strings.TrimSpace(v)
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		if runs[name] == nil {
			runs[name] = map[string][]float64{}
			order = append(order, name)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err == nil {
				runs[name][f[i+1]] = append(runs[name][f[i+1]], v)
			}
		}
	}
	res := map[string]*result{}
	for _, n := range order {
		r := &result{name: n, metrics: map[string]float64{}}
		for unit, vs := range runs[n] {
			sort.Float64s(vs)
			r.metrics[unit] = vs[len(vs)/2]
		}
		res[n] = r
	}
	return res, info
}

func split(name string) (group, impl string) {
	i := strings.LastIndex(name, "/")
	if i < 0 {
		return name, ""
	}
	return name[:i], name[i+1:]
}

func isAnchor(impl string) bool {
	for _, a := range anchors {
		if impl == a {
			return true
		}
	}
	return false
}

func report(w io.Writer, res map[string]*result, info runInfo, command string, px *proxyReport) {
	date := info.date
	if date == "" {
		date = time.Now().UTC().Format(time.DateOnly)
	}
	fmt.Fprintf(w, "# Benchmarks\n\n")
	fmt.Fprintf(w, "Produced by `make bench` (`go run ./internal/tools/benchreport`) on %s, %s, %s/%s, %d CPUs (%s).\n",
		date, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), info.cpu)
	fmt.Fprintf(w, "Every figure is the median of the runs of `%s`; ratios compare implementations\n", command)
	fmt.Fprintf(w, "measured in the same run.\n\n")
	fmt.Fprint(w, intro)

	fmt.Fprintf(w, "\n## Goals\n\n| goal | measured | met |\n| --- | --- | --- |\n")
	for _, g := range goals {
		m, ok := g.check(res)
		fmt.Fprintf(w, "| %s | %s | %s |\n", g.text, m, yes(ok))
	}
	if px != nil {
		for _, g := range px.Goals {
			fmt.Fprintf(w, "| %s | %s | %s |\n", g.Text, g.Measured, yes(g.Met))
		}
		fmt.Fprintf(w, "\n## lanes-exporter beside HAProxy\n\n%s%s%s", proxyIntro, px.Markdown, proxyNotes)
	}

	groups := map[string][]*result{}
	var names []string
	for _, r := range res {
		g, _ := split(r.name)
		if groups[g] == nil {
			names = append(names, g)
		}
		groups[g] = append(groups[g], r)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "\n## All figures\n")
	top := ""
	for _, g := range names {
		if t := strings.SplitN(g, "/", 2)[0]; t != top {
			top = t
			fmt.Fprintf(w, "\n### %s\n\n| scenario | implementation | ns/op | B/op | allocs/op | other | ratios |\n| --- | --- | ---: | ---: | ---: | --- | --- |\n", t)
		}
		rs := groups[g]
		sort.Slice(rs, func(i, j int) bool { return rs[i].name < rs[j].name })
		for _, r := range rs {
			_, impl := split(r.name)
			var ratios []string
			if !isAnchor(impl) {
				for _, a := range rs {
					if _, ai := split(a.name); isAnchor(ai) && a.metrics["ns/op"] > 0 {
						ratios = append(ratios, fmt.Sprintf("%.2fx %s", r.metrics["ns/op"]/a.metrics["ns/op"], ai))
					}
				}
			}
			var other []string
			for unit, v := range r.metrics {
				if unit != "ns/op" && unit != "B/op" && unit != "allocs/op" {
					other = append(other, fmt.Sprintf("%s %s", num(v), unit))
				}
			}
			sort.Strings(other)
			scen := strings.TrimPrefix(strings.TrimPrefix(g, top), "/")
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", scen, impl, num(r.metrics["ns/op"]),
				num(r.metrics["B/op"]), num(r.metrics["allocs/op"]), strings.Join(other, ", "), strings.Join(ratios, ", "))
		}
	}
}

func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case v < 1000:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}
