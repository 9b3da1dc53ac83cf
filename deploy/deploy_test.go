// Package deploy holds the files that run lanes-exporter where operators
// run things: the Dockerfile (at the repository root), a systemd unit, and
// Kubernetes manifests. These tests check each with what runs here.
package deploy

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/llmlanes/llmlanes/alerts"
	"github.com/llmlanes/llmlanes/internal/exporter"
)

// build makes the production binary the way the Dockerfile does.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "lanes-exporter")
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "nodemo", "-ldflags", "-s -w", "-o", bin, "../cmd/lanes-exporter")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The Dockerfile: multi-stage, a static binary without the simulator, on a
// distroless (or scratch) base, as a non-root user. No Docker engine runs
// here, so the test builds the binary with the Dockerfile's own command and
// checks it is static and runs.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	froms := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(df, -1)
	if len(froms) < 2 {
		t.Fatalf("%d stages, want a multi-stage build", len(froms))
	}
	final := froms[len(froms)-1][1]
	if final != "scratch" && !strings.HasPrefix(final, "gcr.io/distroless/static") {
		t.Fatalf("final stage FROM %s, want scratch or distroless static", final)
	}
	user := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindStringSubmatch(df)
	if user == nil || strings.HasPrefix(user[1], "root") || strings.HasPrefix(user[1], "0") {
		t.Fatalf("USER %v: want a non-root user", user)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-tags nodemo", "./cmd/lanes-exporter", "EXPOSE 4470"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	bin := build(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary is dynamically linked: it would not run on distroless static")
		}
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "lanes-exporter ") {
		t.Fatalf("--version: %v %s", err, out)
	}
	if out, err := exec.Command(bin, "--demo").CombinedOutput(); err == nil || !strings.Contains(string(out), "not in this build") {
		t.Fatalf("the production build ran the demo: %v %s", err, out)
	}
}

// The systemd unit passes systemd-analyze verify (with its binary paths
// pointed at a real build, since verify checks that they exist).
func TestSystemdUnit(t *testing.T) {
	unit, err := os.ReadFile("systemd/lanes-exporter.service")
	if err != nil {
		t.Fatal(err)
	}
	bin := build(t)
	dir := t.TempDir()
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/lanes-exporter", bin)
	file := filepath.Join(dir, "lanes-exporter.service")
	os.WriteFile(file, []byte(text), 0o644)
	out, err := exec.Command("systemd-analyze", "verify", file).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, want := range []string{"ExecReload=/bin/kill -HUP $MAINPID", "--check-config", "NoNewPrivileges=yes", "TimeoutStopSec=", "--web.listen-address :4471"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit lacks %q", want)
		}
	}
}

type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec yaml.Node         `yaml:"spec"`
}

func docs(t *testing.T, file string) []object {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []object
	for {
		var o object
		if err := dec.Decode(&o); err != nil {
			if err.Error() == "EOF" {
				return out
			}
			t.Fatalf("%s: %v", file, err)
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Fatalf("%s: an object without apiVersion, kind or name: %+v", file, o)
		}
		out = append(out, o)
	}
}

// The Kubernetes manifests fit together: the config is a valid
// lanes-exporter configuration, selectors match labels, probes and the
// ServiceMonitor use routes and ports that exist, and the PrometheusRule is
// the rule file's groups.
func TestKubernetesManifests(t *testing.T) {
	objs := docs(t, "kubernetes/lanes-exporter.yaml")
	by := map[string]object{}
	for _, o := range objs {
		by[o.Kind] = o
	}
	for _, k := range []string{"ConfigMap", "Deployment", "Service", "ServiceMonitor"} {
		if _, ok := by[k]; !ok {
			t.Fatalf("no %s", k)
		}
	}
	if _, err := exporter.ParseConfig("configmap lanes.yaml", []byte(by["ConfigMap"].Data["lanes.yaml"])); err != nil {
		t.Fatalf("the ConfigMap's configuration: %v", err)
	}
	var dep struct {
		Replicas int
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		}
		Template struct {
			Metadata struct{ Labels map[string]string }
			Spec     struct {
				Containers []struct {
					Args  []string
					Ports []struct {
						Name          string
						ContainerPort int `yaml:"containerPort"`
					}
					ReadinessProbe struct {
						HTTPGet struct{ Path, Port string } `yaml:"httpGet"`
					} `yaml:"readinessProbe"`
					LivenessProbe struct {
						HTTPGet struct{ Path, Port string } `yaml:"httpGet"`
					} `yaml:"livenessProbe"`
					VolumeMounts []struct {
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				}
			}
		}
	}
	depObj := by["Deployment"]
	if err := depObj.Spec.Decode(&dep); err != nil {
		t.Fatal(err)
	}
	for k, v := range dep.Selector.MatchLabels {
		if dep.Template.Metadata.Labels[k] != v {
			t.Fatalf("the Deployment's selector %v does not match its pods' labels %v", dep.Selector.MatchLabels, dep.Template.Metadata.Labels)
		}
	}
	// Two ports: the proxy's (the config's listen) and the telemetry's
	// (--web.listen-address), which the ServiceMonitor scrapes.
	c := dep.Template.Spec.Containers[0]
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	args := strings.Join(c.Args, " ")
	if c.ReadinessProbe.HTTPGet.Path != "/-/ready" || c.LivenessProbe.HTTPGet.Path != "/-/healthy" ||
		ports[c.ReadinessProbe.HTTPGet.Port] != 4470 || ports[c.LivenessProbe.HTTPGet.Port] == 0 ||
		ports["proxy"] != 4470 || ports["telemetry"] != 4471 || !strings.Contains(args, "--web.listen-address 0.0.0.0:4471") ||
		!strings.Contains(by["ConfigMap"].Data["lanes.yaml"], "listen: 0.0.0.0:4470") {
		t.Fatalf("probes and ports: %+v", c)
	}
	if !strings.Contains(strings.Join(c.Args, " "), c.VolumeMounts[0].MountPath+"/lanes.yaml") {
		t.Fatalf("--config does not name the mounted file: %v %v", c.Args, c.VolumeMounts)
	}
	var svc struct {
		Selector map[string]string
		Ports    []struct{ Name string }
	}
	svcObj, smObj := by["Service"], by["ServiceMonitor"]
	svcObj.Spec.Decode(&svc)
	for k, v := range svc.Selector {
		if dep.Template.Metadata.Labels[k] != v {
			t.Fatalf("the Service's selector %v matches no pod", svc.Selector)
		}
	}
	var sm struct {
		JobLabel string `yaml:"jobLabel"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		}
		Endpoints []struct{ Port, Path string }
	}
	smObj.Spec.Decode(&sm)
	for k, v := range sm.Selector.MatchLabels {
		if by["Service"].Metadata.Labels[k] != v {
			t.Fatalf("the ServiceMonitor's selector %v matches no Service", sm.Selector.MatchLabels)
		}
	}
	svcPorts := map[string]bool{}
	for _, p := range svc.Ports {
		svcPorts[p.Name] = true
	}
	if sm.Endpoints[0].Port != "telemetry" || !svcPorts["telemetry"] || !svcPorts["proxy"] || sm.Endpoints[0].Path != "/metrics" ||
		by["Service"].Metadata.Labels[sm.JobLabel] != "lanes-exporter" {
		t.Fatalf("the ServiceMonitor scrapes %+v with job label %s: want the Service's telemetry port, /metrics, job lanes-exporter", sm.Endpoints, sm.JobLabel)
	}

	rule := docs(t, "kubernetes/prometheusrule.yaml")
	if len(rule) != 1 || rule[0].Kind != "PrometheusRule" || rule[0].APIVersion != "monitoring.coreos.com/v1" {
		t.Fatalf("prometheusrule.yaml: %+v", rule)
	}
	var got, want any
	rule[0].Spec.Decode(&got)
	yaml.Unmarshal(alerts.Source, &want)
	gb, _ := yaml.Marshal(got)
	wb, _ := yaml.Marshal(want)
	if !bytes.Equal(gb, wb) {
		t.Fatal("the PrometheusRule's spec is not the rule file's groups: run go run ./alerts/gen")
	}
}
