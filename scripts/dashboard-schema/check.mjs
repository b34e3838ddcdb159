// Checks Grafana dashboards and provisioning files; run through `check.sh`, which installs the
// pinned packages first.
//
//   node check.mjs --cache DIR --provisioning DIR DASHBOARD.json...
//
// 1. Types: each dashboard's JSON text becomes an object literal assigned to `StrictDashboard`
//    (grafana-dashboard.ts, built on npm `@grafana/schema`), each provisioning YAML file one
//    assigned to `DatasourceProvisioning` / `DashboardProvisioning`, and the TypeScript compiler
//    checks them with `strict` and `exactOptionalPropertyTypes`: unknown keys (excess-property
//    check on literals), unknown panel plugins, options of another plugin and wrong value types
//    fail. A dashboard's line numbers are kept, so errors point into the JSON file.
// 2. References: every `datasource` reference must name a data source the provisioning defines
//    (directly by uid or name, or through a declared `datasource` variable of the same plugin
//    type), and every `$var`, `${var}`, `${var:format}` or `[[var]]` in any string (queries,
//    titles, legends, uids) must be declared in `templating.list` or be a Grafana built-in.
//
// Prints `error: FILE:LINE:COL: …` or `error: FILE: WHERE: …` lines on stderr and exits 1 when
// anything fails; prints one `ok: …` line and exits 0 otherwise; exits 2 on bad usage.

import { copyFileSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

function usage(message) {
  console.error(`error: ${message}`);
  console.error('usage: node check.mjs --cache DIR --provisioning DIR DASHBOARD.json...');
  process.exit(2);
}

const args = process.argv.slice(2);
let cache;
let provisioning;
const dashboards = [];
while (args.length > 0) {
  const arg = args.shift();
  if (arg === '--cache') cache = args.shift();
  else if (arg === '--provisioning') provisioning = args.shift();
  else if (arg.startsWith('--')) usage(`unknown option ${arg}`);
  else dashboards.push(arg);
}
if (!cache) usage('--cache DIR (where check.sh installed the packages) is required');
if (!provisioning) usage('--provisioning DIR is required');
if (dashboards.length === 0) usage('no dashboard given');

const require = createRequire(path.join(path.resolve(cache), 'package.json'));
const ts = require('typescript');
const YAML = require('yaml');
const schemaVersion = require('@grafana/schema/package.json').version;

const problems = [];
const problem = (text) => problems.push(text);

// ---------------------------------------------------------------------------------------------
// Provisioning: data sources and dashboard providers.

/** `{ kind: 'datasources' | 'dashboards', file, value }` for every YAML file of the folder. */
function readProvisioning(dir) {
  const files = [];
  for (const kind of ['datasources', 'dashboards']) {
    let names = [];
    try {
      names = readdirSync(path.join(dir, kind)).filter((n) => /\.ya?ml$/.test(n)).sort();
    } catch {
      problem(`${path.join(dir, kind)}: missing: Grafana reads its provisioning from here`);
    }
    for (const name of names) {
      const file = path.join(dir, kind, name);
      const doc = YAML.parseDocument(readFileSync(file, 'utf8'), { prettyErrors: true });
      if (doc.errors.length > 0) {
        doc.errors.forEach((e) => problem(`${file}: not valid YAML: ${e.message}`));
        continue;
      }
      files.push({ kind, file, value: doc.toJS() });
    }
  }
  return files;
}

const provisioningFiles = readProvisioning(provisioning);
/** Every provisioned data source: `{ name, type, uid, file }`. */
const datasources = provisioningFiles
  .filter((f) => f.kind === 'datasources')
  .flatMap((f) =>
    (Array.isArray(f.value?.datasources) ? f.value.datasources : []).map((d) => ({
      name: d?.name,
      type: d?.type,
      uid: d?.uid,
      file: f.file,
    })),
  );
if (datasources.length === 0) {
  problem(`${provisioning}: no data source is provisioned under datasources/*.yml`);
}
const defined = () =>
  datasources.map((d) => `uid "${d.uid}" (type ${d.type}, name "${d.name}")`).join(', ') ||
  'none';

// ---------------------------------------------------------------------------------------------
// References inside a dashboard: data sources and template variables.

/** Grafana's global variables (Grafana docs, "Global variables"). */
const BUILTIN_VARIABLES = new Set([
  '__all_variables', '__dashboard', '__data', '__field', '__from', '__interval', '__interval_ms',
  '__name', '__org', '__range', '__range_ms', '__range_s', '__rate_interval', '__rate_interval_ms',
  '__series', '__timeFilter', '__timezone', '__to', '__url', '__url_time_range', '__user',
  '__value', '__auto', 'timeFilter',
]);
/** Data sources every Grafana has without provisioning. */
const BUILTIN_DATASOURCE_UIDS = new Set(['grafana', '-- Grafana --', '-- Mixed --', '-- Dashboard --']);

/** `panels[6].targets[0].expr` → `panels[6] ("Uplink / downlink bitrate").targets[0].expr`. */
function describe(dashboard, at) {
  let text = '';
  let node = dashboard;
  for (const step of at) {
    node = node?.[step];
    text += typeof step === 'number' ? `[${step}]` : `${text ? '.' : ''}${step}`;
    if (typeof step === 'number' && typeof node?.title === 'string') text += ` ("${node.title}")`;
  }
  return text || '(top level)';
}

/** Calls `visit(value, path, key)` for every value of a JSON tree. */
function walk(value, at, visit) {
  visit(value, at);
  if (Array.isArray(value)) value.forEach((v, i) => walk(v, [...at, i], visit));
  else if (value && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) walk(v, [...at, k], visit);
  }
}

const VARIABLE_USE = /\$\{([A-Za-z0-9_]+)(?:[.:][^}]*)?\}|\[\[([A-Za-z0-9_]+)(?::[^\]]*)?\]\]|\$([A-Za-z0-9_]+)/g;

/** The variable a data-source uid or name stands for (`$ds`, `${ds}`), if it is one. */
function variableOf(text) {
  const m = /^\$\{([A-Za-z0-9_]+)\}$|^\$([A-Za-z0-9_]+)$|^\[\[([A-Za-z0-9_]+)\]\]$/.exec(text);
  return m ? (m[1] ?? m[2] ?? m[3]) : undefined;
}

function checkReferences(file, dashboard) {
  const variables = new Map();
  const list = dashboard?.templating?.list;
  if (Array.isArray(list)) {
    for (const v of list) if (typeof v?.name === 'string') variables.set(v.name, v);
  }
  const declared = [...variables.keys()].map((n) => `$${n}`).join(', ') || 'none';

  walk(dashboard, [], (value, at) => {
    // Template variables in every string.
    if (typeof value === 'string') {
      for (const m of value.matchAll(VARIABLE_USE)) {
        const name = m[1] ?? m[2] ?? m[3];
        if (variables.has(name) || BUILTIN_VARIABLES.has(name)) continue;
        if (name.startsWith('__auto_interval_')) continue;
        problem(
          `${file}: ${describe(dashboard, at)}: variable $${name} is used but not declared in ` +
            `templating.list (declared: ${declared}) nor a Grafana built-in`,
        );
      }
    }
    // Data-source references.
    if (at[at.length - 1] !== 'datasource' || value === null || value === undefined) return;
    const where = `${file}: ${describe(dashboard, at)}`;
    const ref = typeof value === 'string' ? { name: value } : value;
    if (typeof ref !== 'object' || Array.isArray(ref)) return; // the type check reports it
    const key = ref.uid ?? ref.name;
    if (typeof key !== 'string') {
      problem(`${where}: data source reference without a uid: name one of ${defined()}`);
      return;
    }
    if (BUILTIN_DATASOURCE_UIDS.has(key)) return;
    const variable = variableOf(key);
    if (variable !== undefined) {
      const v = variables.get(variable);
      if (v === undefined) return; // reported above as an undeclared variable
      if (v.type !== 'datasource') {
        problem(`${where}: data source ${key} names variable $${variable}, which is of type ` +
          `"${v.type}", not "datasource"`);
        return;
      }
      if (ref.type !== undefined && ref.type !== v.query) {
        problem(`${where}: data source type "${ref.type}" but variable $${variable} selects ` +
          `data sources of type "${v.query}"`);
      }
      if (!datasources.some((d) => d.type === v.query)) {
        problem(`${where}: variable $${variable} selects data sources of type "${v.query}", ` +
          `but ${provisioning} provisions none of that type (defined: ${defined()})`);
      }
      return;
    }
    const found = datasources.find((d) => (ref.uid !== undefined ? d.uid : d.name) === key);
    if (found === undefined) {
      problem(`${where}: data source ${ref.uid !== undefined ? 'uid' : 'name'} "${key}" is not ` +
        `defined by the provisioning files in ${provisioning} (defined: ${defined()})`);
    } else if (ref.type !== undefined && ref.type !== found.type) {
      problem(`${where}: data source uid "${key}" has type "${found.type}" in ${found.file}, ` +
        `not "${ref.type}"`);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Types: one generated .ts file per input, compiled together.

const gen = path.join(path.resolve(cache), 'gen', `${process.pid}-${Date.now()}`);
mkdirSync(gen, { recursive: true });
for (const types of ['grafana-dashboard.ts', 'grafana-provisioning.ts']) {
  copyFileSync(path.join(here, types), path.join(gen, types));
}
/** Generated file → `{ file, firstLineShift }`: how to point its errors at the original. */
const sources = new Map();

dashboards.forEach((file, i) => {
  const text = readFileSync(file, 'utf8');
  let dashboard;
  try {
    dashboard = JSON.parse(text);
  } catch (e) {
    problem(`${file}: not valid JSON: ${e.message}`);
    return;
  }
  if (!text.startsWith('{')) {
    problem(`${file}: must start with "{" (a dashboard is one JSON object)`);
    return;
  }
  checkReferences(file, dashboard);
  // The JSON text itself, not a re-serialisation: line N of the .ts file is line N of the JSON.
  const prefix = "import type { StrictDashboard } from './grafana-dashboard'; " +
    'export const dashboard: StrictDashboard = ';
  const generated = path.join(gen, `dashboard-${i}.ts`);
  writeFileSync(generated, `${prefix}${text.trimEnd()};\n`);
  sources.set(generated, { file, firstLineShift: prefix.length });
});

provisioningFiles.forEach(({ kind, file, value }, i) => {
  const type = kind === 'datasources' ? 'DatasourceProvisioning' : 'DashboardProvisioning';
  const generated = path.join(gen, `provisioning-${i}.ts`);
  writeFileSync(
    generated,
    `import type { ${type} } from './grafana-provisioning';\n` +
      `export const provisioning: ${type} = ${JSON.stringify(value, null, 2)};\n`,
  );
  sources.set(generated, { file: `${file} (as JSON)`, yaml: true });
});

const program = ts.createProgram([...sources.keys()], {
  strict: true,
  exactOptionalPropertyTypes: true,
  noEmit: true,
  skipLibCheck: true,
  target: ts.ScriptTarget.ES2022,
  module: ts.ModuleKind.ESNext,
  moduleResolution: ts.ModuleResolutionKind.Bundler,
  types: [],
});
for (const d of ts.getPreEmitDiagnostics(program)) {
  const message = ts.flattenDiagnosticMessageText(d.messageText, '\n    ');
  if (d.file === undefined) {
    problem(`typescript: ${message}`);
    continue;
  }
  const { line, character } = d.file.getLineAndCharacterOfPosition(d.start ?? 0);
  const source = sources.get(path.resolve(d.file.fileName));
  if (source === undefined) {
    problem(`${d.file.fileName}:${line + 1}:${character + 1}: ${message}`);
  } else if (source.yaml) {
    // Line numbers of the YAML are lost: name the file, TypeScript names the key.
    problem(`${source.file}: ${message}`);
  } else {
    const column = line === 0 ? character - source.firstLineShift : character;
    problem(`${source.file}:${line + 1}:${column + 1}: ${message}`);
  }
}
rmSync(gen, { recursive: true, force: true });

if (problems.length > 0) {
  for (const p of problems) console.error(`error: ${p}`);
  process.exit(1);
}
console.log(
  `ok: ${dashboards.length} dashboard(s) and ${provisioningFiles.length} provisioning file(s) ` +
    `checked against @grafana/schema ${schemaVersion} with TypeScript ${ts.version}; ` +
    `data-source and variable references resolved`,
);
