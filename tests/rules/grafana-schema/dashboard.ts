// The type of a gpufeed dashboard, built from Grafana's published schema (@grafana/schema: the TypeScript types
// Grafana generates from its CUE kinds -- the dashboard kind and each panel plugin's panelcfg). The test in
// tests/rules/test_dashboards.py writes each generated board as `const board: Board = <its JSON>` and runs tsc:
// an unknown key anywhere (object literals get excess-property checks), a wrong type or a value outside an enum
// fails it.
//
// Two adaptations, both of what Grafana itself does when it loads a dashboard JSON:
// - JSON has strings where the TypeScript types have enums (ThresholdsMode.Absolute is "absolute"): Json<T> maps
//   every enum to the union of its values and keeps every other type as it is.
// - A panel's options and its fieldConfig custom block are merged with the plugin's defaults on load, so a field
//   the schema marks required because it has a default may be left out there (Partial), nowhere else.
// And one addition the dashboard schema leaves to the data source plugin: Prometheus's query and annotation
// fields (@grafana/schema no longer ships the Prometheus dataquery kind).
import type * as D from "./node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen";
import type * as C from "./node_modules/@grafana/schema/dist/types/common/common.gen";
import type * as bargauge from "./node_modules/@grafana/schema/dist/types/raw/composable/bargauge/panelcfg/x/types.gen";
import type * as heatmap from "./node_modules/@grafana/schema/dist/types/raw/composable/heatmap/panelcfg/x/types.gen";
import type * as piechart from "./node_modules/@grafana/schema/dist/types/raw/composable/piechart/panelcfg/x/types.gen";
import type * as stat from "./node_modules/@grafana/schema/dist/types/raw/composable/stat/panelcfg/x/types.gen";
import type * as statetimeline from "./node_modules/@grafana/schema/dist/types/raw/composable/statetimeline/panelcfg/x/types.gen";
import type * as table from "./node_modules/@grafana/schema/dist/types/raw/composable/table/panelcfg/x/types.gen";
import type * as timeseries from "./node_modules/@grafana/schema/dist/types/raw/composable/timeseries/panelcfg/x/types.gen";

type Json<T> = T extends string ? `${T}` : T extends number | boolean | null | undefined ? T
  : T extends Array<infer U> ? Array<Json<U>> : T extends object ? { [K in keyof T]: Json<T[K]> } : T;
type Defaulted<T> = T extends string ? `${T}` : T extends number | boolean | null | undefined ? T
  : T extends Array<infer U> ? Array<Defaulted<U>> : T extends object ? { [K in keyof T]?: Defaulted<T[K]> } : T;

// The Prometheus data source's query (public/app/plugins/datasource/prometheus: PromQuery) on the common DataQuery.
type PromQuery = Json<C.DataQuery> & {
  expr: string; legendFormat?: string; instant?: boolean; range?: boolean; interval?: string;
  format?: "time_series" | "table" | "heatmap";
};
// ... and its annotation fields (PrometheusAnnotationSupport), on the dashboard's AnnotationQuery.
type PromAnnotation = Json<D.AnnotationQuery> & {
  expr: string; step?: string; titleFormat?: string; textFormat?: string; tagKeys?: string; useValueForTime?: boolean;
};

type FieldDefaults<F> = Json<Omit<D.FieldConfig, "custom">> & { custom: Defaulted<F> };
type Kind<K extends string, O, F> = Json<Omit<D.Panel, "type" | "options" | "fieldConfig" | "targets">> & {
  type: K;
  options: Defaulted<O>;
  fieldConfig: Json<Omit<D.FieldConfigSource, "defaults">> & { defaults: FieldDefaults<F> };
  targets: PromQuery[];
};
type None = Record<string, never>; // stat and bargauge define no custom field config

export type AnyPanel =
  | Json<D.RowPanel>
  | Kind<"timeseries", timeseries.Options, timeseries.FieldConfig>
  | Kind<"stat", stat.Options, None>
  | Kind<"bargauge", bargauge.Options, None>
  | Kind<"table", table.Options, table.FieldConfig>
  | Kind<"piechart", piechart.Options, piechart.FieldConfig>
  | Kind<"heatmap", heatmap.Options, heatmap.FieldConfig>
  | Kind<"state-timeline", statetimeline.Options, statetimeline.FieldConfig>;

export type Board = Json<Omit<D.Dashboard, "panels" | "annotations">> & {
  panels: AnyPanel[];
  annotations: { list: PromAnnotation[] };
};
