// The dashboards as deploy/grafana/generate.py writes them (copied here by it: jsonnet-bundler vendors only
// this directory).
{
  grafanaDashboards+:: {
    'gpufeed-fleet.json': (import 'dashboards/gpufeed-fleet.json'),
    'gpufeed-host.json': (import 'dashboards/gpufeed-host.json'),
  },
}
