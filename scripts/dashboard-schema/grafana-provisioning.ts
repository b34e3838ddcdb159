// Grafana's provisioning files (`dashboards/provisioning/{datasources,dashboards}/*.yml`), typed
// after Grafana's documentation ("Provision Grafana": data sources, dashboard providers). Grafana
// publishes no TypeScript type for them, so these are written by hand; `check.mjs` assigns each
// parsed YAML file, as an object literal, to one of them so that unknown keys fail.

/** `jsonData` of a Prometheus data source (Grafana's Prometheus data source documentation). */
interface PrometheusJsonData {
  /** Lowest step Grafana asks for: the scrape interval. */
  timeInterval?: string;
  queryTimeout?: string;
  httpMethod?: 'POST' | 'GET';
  manageAlerts?: boolean;
  prometheusType?: 'Prometheus' | 'Cortex' | 'Mimir' | 'Thanos';
  prometheusVersion?: string;
  cacheLevel?: 'Low' | 'Medium' | 'High' | 'None';
  incrementalQuerying?: boolean;
  incrementalQueryOverlapWindow?: string;
  disableRecordingRules?: boolean;
  disableMetricsLookup?: boolean;
  defaultEditor?: 'code' | 'builder';
  customQueryParameters?: string;
  exemplarTraceIdDestinations?: Array<{ name: string; datasourceUid?: string; url?: string }>;
  tlsAuth?: boolean;
  tlsAuthWithCACert?: boolean;
  tlsSkipVerify?: boolean;
}

interface ProvisionedDatasource {
  name: string;
  /** Only Prometheus is provisioned; the dashboards' queries are typed as Prometheus queries. */
  type: 'prometheus';
  uid: string;
  url: string;
  access?: 'proxy' | 'direct';
  orgId?: number;
  isDefault?: boolean;
  editable?: boolean;
  version?: number;
  basicAuth?: boolean;
  basicAuthUser?: string;
  withCredentials?: boolean;
  jsonData?: PrometheusJsonData;
  secureJsonData?: { basicAuthPassword?: string; httpHeaderValue1?: string };
}

export interface DatasourceProvisioning {
  apiVersion: 1;
  prune?: boolean;
  deleteDatasources?: Array<{ name: string; orgId?: number }>;
  datasources: ProvisionedDatasource[];
}

interface DashboardProvider {
  name: string;
  type: 'file';
  orgId?: number;
  folder?: string;
  folderUid?: string;
  disableDeletion?: boolean;
  updateIntervalSeconds?: number;
  allowUiUpdates?: boolean;
  options: { path: string; foldersFromFilesStructure?: boolean };
}

export interface DashboardProvisioning {
  apiVersion: 1;
  providers: DashboardProvider[];
}
