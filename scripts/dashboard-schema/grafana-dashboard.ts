// The dashboard JSON model as Grafana publishes it (npm `@grafana/schema`), made strict enough for
// `tsc` to reject what Grafana would silently drop or fail to render:
//
// - the top level, variables, time settings and panel frames are Grafana's own `Dashboard`,
//   `VariableModel` and `Panel` types, unchanged;
// - `Panel.type` is narrowed from `string` to the ids of the panel plugins that ship with Grafana,
//   and each id brings that plugin's published `Options` and field-config `custom` types
//   (`@grafana/schema/dist/esm/raw/composable/<plugin>/panelcfg/...`), so an unknown plugin
//   (`graph`, `singlestat`, a typo) or options of another plugin fail;
// - panel options are accepted partially (Grafana fills the defaults) but every key must exist,
//   with the published value type, at every depth;
// - queries are Prometheus queries (the only data source type the provisioning defines), typed
//   after Grafana's `PrometheusDataQuery` schema (grafana/cog `schemas/composable/prometheus`).
//
// `check.mjs` assigns each dashboard, as an object literal, to `StrictDashboard`: TypeScript's
// excess-property check then rejects every unknown key.

import type { DataQuery, Dashboard, Panel, RowPanel, VariableModel } from '@grafana/schema';
import type {
  DataSourceRef,
  FieldConfig as RawFieldConfig,
  FieldConfigSource as RawFieldConfigSource,
} from '@grafana/schema/dist/esm/raw/dashboard/x/Dashboard_types.gen';

import type * as AnnotationsList from '@grafana/schema/dist/esm/raw/composable/annotationslist/panelcfg/x/AnnotationsListPanelCfg_types.gen';
import type * as BarChart from '@grafana/schema/dist/esm/raw/composable/barchart/panelcfg/x/BarChartPanelCfg_types.gen';
import type * as BarGauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type * as Candlestick from '@grafana/schema/dist/esm/raw/composable/candlestick/panelcfg/x/CandlestickPanelCfg_types.gen';
import type * as Canvas from '@grafana/schema/dist/esm/raw/composable/canvas/panelcfg/x/CanvasPanelCfg_types.gen';
import type * as DashboardList from '@grafana/schema/dist/esm/raw/composable/dashboardlist/panelcfg/x/DashboardListPanelCfg_types.gen';
import type * as Debug from '@grafana/schema/dist/esm/raw/composable/debug/panelcfg/x/DebugPanelCfg_types.gen';
import type * as Gauge from '@grafana/schema/dist/esm/raw/composable/gauge/panelcfg/x/GaugePanelCfg_types.gen';
import type * as Geomap from '@grafana/schema/dist/esm/raw/composable/geomap/panelcfg/x/GeomapPanelCfg_types.gen';
import type * as Heatmap from '@grafana/schema/dist/esm/raw/composable/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen';
import type * as Histogram from '@grafana/schema/dist/esm/raw/composable/histogram/panelcfg/x/HistogramPanelCfg_types.gen';
import type * as Logs from '@grafana/schema/dist/esm/raw/composable/logs/panelcfg/x/LogsPanelCfg_types.gen';
import type * as News from '@grafana/schema/dist/esm/raw/composable/news/panelcfg/x/NewsPanelCfg_types.gen';
import type * as NodeGraph from '@grafana/schema/dist/esm/raw/composable/nodegraph/panelcfg/x/NodeGraphPanelCfg_types.gen';
import type * as PieChart from '@grafana/schema/dist/esm/raw/composable/piechart/panelcfg/x/PieChartPanelCfg_types.gen';
import type * as Stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as StateTimeline from '@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen';
import type * as StatusHistory from '@grafana/schema/dist/esm/raw/composable/statushistory/panelcfg/x/StatusHistoryPanelCfg_types.gen';
import type * as Table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type * as Text from '@grafana/schema/dist/esm/raw/composable/text/panelcfg/x/TextPanelCfg_types.gen';
import type * as TimeSeries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type * as Trend from '@grafana/schema/dist/esm/raw/composable/trend/panelcfg/x/TrendPanelCfg_types.gen';
import type * as XYChart from '@grafana/schema/dist/esm/raw/composable/xychart/panelcfg/x/XYChartPanelCfg_types.gen';

/** A plugin without field-config `custom` settings accepts none. */
type NoCustom = Record<never, never>;

/** Panel plugin id (what `Panel.type` holds) → its published options and `custom` field config. */
interface PanelPlugins {
  annolist: { options: AnnotationsList.Options; custom: NoCustom };
  barchart: { options: BarChart.Options; custom: BarChart.FieldConfig };
  bargauge: { options: BarGauge.Options; custom: NoCustom };
  candlestick: { options: Candlestick.Options; custom: Candlestick.FieldConfig };
  canvas: { options: Canvas.Options; custom: NoCustom };
  dashlist: { options: DashboardList.Options; custom: NoCustom };
  debug: { options: Debug.Options; custom: NoCustom };
  gauge: { options: Gauge.Options; custom: NoCustom };
  geomap: { options: Geomap.Options; custom: NoCustom };
  heatmap: { options: Heatmap.Options; custom: Heatmap.FieldConfig };
  histogram: { options: Histogram.Options; custom: Histogram.FieldConfig };
  logs: { options: Logs.Options; custom: NoCustom };
  news: { options: News.Options; custom: NoCustom };
  nodeGraph: { options: NodeGraph.Options; custom: NoCustom };
  piechart: { options: PieChart.Options; custom: PieChart.FieldConfig };
  stat: { options: Stat.Options; custom: NoCustom };
  'state-timeline': { options: StateTimeline.Options; custom: StateTimeline.FieldConfig };
  'status-history': { options: StatusHistory.Options; custom: StatusHistory.FieldConfig };
  table: { options: Table.Options; custom: Table.FieldConfig };
  text: { options: Text.Options; custom: NoCustom };
  timeseries: { options: TimeSeries.Options; custom: TimeSeries.FieldConfig };
  trend: { options: Trend.Options; custom: Trend.FieldConfig };
  xychart: { options: XYChart.Options; custom: XYChart.FieldConfig };
}

/**
 * Every key optional at every depth, no key added. String enums become the union of their
 * values: a JSON string can never be a TypeScript enum member, but it can be its value.
 */
type Accepted<T> = T extends string
  ? `${T}`
  : T extends number | boolean | bigint | symbol | null | undefined
    ? T
    : T extends ReadonlyArray<infer U>
      ? Array<Accepted<U>>
      : T extends (...args: never[]) => unknown
        ? never
        : { [K in keyof T]?: Accepted<T[K]> };

/** Grafana's `PrometheusDataQuery`: `DataQuery` plus the Prometheus fields. */
export interface PrometheusQuery extends Omit<DataQuery, 'datasource'> {
  datasource?: DataSourceRef | null;
  /** The PromQL expression Prometheus evaluates. */
  expr: string;
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  editorMode?: 'code' | 'builder';
  format?: 'time_series' | 'table' | 'heatmap';
  /** Series name template, e.g. `{{reason}}`. */
  legendFormat?: string;
  /** @deprecated by Grafana, still accepted. */
  intervalFactor?: number;
  interval?: string;
}

type StrictFieldConfigSource<Custom> = Omit<RawFieldConfigSource, 'defaults'> & {
  defaults: Omit<RawFieldConfig, 'custom'> & { custom?: Accepted<Custom> };
};

type PanelOf<Id extends keyof PanelPlugins> = Omit<
  Panel,
  'type' | 'options' | 'fieldConfig' | 'targets' | 'datasource'
> & {
  type: Id;
  datasource?: DataSourceRef | null;
  options?: Accepted<PanelPlugins[Id]['options']>;
  fieldConfig?: StrictFieldConfigSource<PanelPlugins[Id]['custom']>;
  targets?: PrometheusQuery[];
};

/** A panel of one of Grafana's built-in panel plugins, discriminated by `type`. */
export type StrictPanel = { [Id in keyof PanelPlugins]: PanelOf<Id> }[keyof PanelPlugins];

export type StrictRowPanel = Omit<RowPanel, 'panels'> & { panels: StrictPanel[] };

/** A dashboard as `dashboards/*.json` must be: Grafana's `Dashboard`, with strict panels. */
export type StrictDashboard = Omit<Dashboard, 'panels' | 'templating'> & {
  panels?: Array<StrictPanel | StrictRowPanel>;
  templating?: { list?: VariableModel[] };
};
