// Package obslint runs Grafana's dashboard-linter and pint over the
// generated dashboards and alert rules (lint.sh, make lint-observability);
// its test runs the script.
package obslint
