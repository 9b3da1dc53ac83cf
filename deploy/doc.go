// Package deploy holds the deployment files (a systemd unit, Kubernetes
// manifests) and, in its tests, the checks that they run lanes-exporter as
// its documentation says.
package deploy
