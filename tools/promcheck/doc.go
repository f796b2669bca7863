// Package promcheck holds only tests: they parse fencer's Prometheus alert
// rules (deploy/monitoring/alerts.yaml) and Grafana dashboard
// (deploy/monitoring/dashboard.json) with Prometheus's own rule and PromQL
// parsers, and check that every metric they name is registered by fencer's
// code, read from its Go source.
package promcheck
