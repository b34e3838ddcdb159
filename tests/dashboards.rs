//! Every dashboard of `dashboards/` passes the schema and reference check of
//! `scripts/dashboard-schema/check.sh`, and deliberately broken copies of `fedshard.json` fail it
//! with a message that names the problem and where it is.
//!
//! The check compiles each dashboard as an object literal typed with Grafana's published schema
//! (npm `@grafana/schema`, pinned, with `typescript`), so unknown keys, unknown panel plugins and
//! options of another plugin fail; then it resolves every data-source reference against
//! `dashboards/provisioning` and every template variable against `templating.list`.
//!
//! Needs `node` (>= 18) and `npm`; the script installs the pinned packages once into
//! `target/tmp/dashboard-schema` (`npm ci`, cached by lock file). Without node or npm every test
//! fails and says how to install them: a pass always means the check ran.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

const CHECK: &str = "scripts/dashboard-schema/check.sh";
const DASHBOARD: &str = "dashboards/fedshard.json";
const PROVISIONING: &str = "dashboards/provisioning";

const INSTALL_HINT: &str = "the dashboard schema check needs Node.js >= 18 and npm: install them \
    (Debian/Ubuntu: `apt-get install nodejs npm`; elsewhere https://nodejs.org/en/download) and \
    let them reach the npm registry once, for `npm ci` of scripts/dashboard-schema";

/// Where `check.sh` installs the pinned npm packages: inside the (ignored) target directory.
fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-schema")
}

fn check_command() -> Command {
    let mut command = Command::new("bash");
    command
        .arg(CHECK)
        .env("FEDSHARD_DASHBOARD_SCHEMA_CACHE", cache());
    command
}

/// Fails, saying how to get them, unless node and npm run; installs the packages once.
fn require_installed() {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        for tool in ["node", "npm"] {
            match Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .status()
            {
                Ok(status) if status.success() => {}
                Ok(status) => return Err(format!("`{tool} --version` failed ({status})")),
                Err(e) => return Err(format!("cannot run `{tool}` ({e}): is it on PATH?")),
            }
        }
        let out = check_command()
            .arg("--install")
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`{CHECK} --install` failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(e) = installed {
        panic!("{e}\n{INSTALL_HINT}");
    }
}

/// Runs the check on `dashboards` with the provisioning folder `provisioning`.
fn check(dashboards: &[&Path], provisioning: &Path) -> Output {
    require_installed();
    check_command()
        .arg("--provisioning")
        .arg(provisioning)
        .args(dashboards)
        .output()
        .expect("run bash")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn fedshard_dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap()
}

/// The panel titled `title` (titles are unique in `fedshard.json`).
fn panel<'a>(dashboard: &'a mut Value, title: &str) -> &'a mut Value {
    dashboard["panels"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["title"] == title)
        .unwrap_or_else(|| panic!("no panel titled {title:?} in {DASHBOARD}"))
}

/// A copy of `fedshard.json` with `edit` applied, written pretty-printed into a temp dir.
struct Broken {
    _dir: tempfile::TempDir,
    path: PathBuf,
    text: String,
}

impl Broken {
    fn new(edit: impl FnOnce(&mut Value)) -> Broken {
        let mut dashboard = fedshard_dashboard();
        edit(&mut dashboard);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broken.json");
        let text = serde_json::to_string_pretty(&dashboard).unwrap();
        std::fs::write(&path, &text).unwrap();
        Broken {
            _dir: dir,
            path,
            text,
        }
    }

    /// `FILE:LINE:` of the first line that contains `needle`, as the check reports positions.
    fn position_of(&self, needle: &str) -> String {
        let line = self
            .text
            .lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} not in the broken copy"));
        format!("{}:{}:", self.path.display(), line + 1)
    }

    /// Runs the check with the real provisioning; it must fail, and its stderr must contain
    /// every one of `expected`. Returns stderr.
    fn rejected_with(&self, expected: &[&str]) -> String {
        let out = check(&[&self.path], Path::new(PROVISIONING));
        let stderr = stderr(&out);
        assert_eq!(
            out.status.code(),
            Some(1),
            "the check must reject {}; stdout {}, stderr {stderr}",
            self.path.display(),
            String::from_utf8_lossy(&out.stdout)
        );
        for want in expected {
            assert!(stderr.contains(want), "expected {want:?} in:\n{stderr}");
        }
        stderr
    }
}

#[test]
fn every_dashboard_passes_the_grafana_schema_and_reference_check() {
    let mut dashboards: Vec<PathBuf> = std::fs::read_dir("dashboards")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    dashboards.sort();
    assert!(
        dashboards.contains(&PathBuf::from(DASHBOARD)),
        "{DASHBOARD} not found among {dashboards:?}"
    );
    let paths: Vec<&Path> = dashboards.iter().map(PathBuf::as_path).collect();
    let out = check(&paths, Path::new(PROVISIONING));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "dashboards fail the check:\n{}",
        stderr(&out)
    );
    // Both provisioning files (data source, dashboard provider) were type-checked too.
    let summary = format!(
        "ok: {} dashboard(s) and 2 provisioning file(s) checked against @grafana/schema",
        dashboards.len()
    );
    assert!(stdout.starts_with(&summary), "{stdout}");
}

/// The control for the cases below: re-serialised into a temp dir, the dashboard still passes,
/// so each rejection below comes from its one edit.
#[test]
fn an_unedited_copy_passes() {
    let copy = Broken::new(|_| {});
    let out = check(&[&copy.path], Path::new(PROVISIONING));
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn an_unknown_key_is_rejected_at_its_line() {
    let broken = Broken::new(|d| {
        panel(d, "Accuracy")["colour"] = "red".into();
    });
    broken.rejected_with(&[
        &broken.position_of("\"colour\""),
        "Object literal may only specify known properties, and '\"colour\"' does not exist in \
         type 'PanelOf<\"timeseries\">'",
    ]);
}

#[test]
fn an_unknown_key_deep_in_panel_options_is_rejected() {
    // `legendd` is a typo of the timeseries plugin's `legend` option.
    let broken = Broken::new(|d| {
        let options = &mut panel(d, "Accuracy")["options"];
        options["legendd"] = options["legend"].clone();
    });
    broken.rejected_with(&[
        &broken.position_of("\"legendd\""),
        "'\"legendd\"' does not exist",
    ]);
}

#[test]
fn a_panel_plugin_grafana_does_not_ship_is_rejected() {
    // `graph` is the Angular panel that Grafana 11 removed; `timeseries` replaced it.
    let broken = Broken::new(|d| {
        panel(d, "Accuracy")["type"] = "graph".into();
    });
    broken.rejected_with(&[
        &broken.position_of("\"graph\""),
        "Type '\"graph\"' is not assignable to type",
    ]);
}

#[test]
fn options_of_another_panel_plugin_are_rejected() {
    // A stat panel has no legend: the timeseries options no longer fit once the type changes.
    let broken = Broken::new(|d| {
        panel(d, "Accuracy")["type"] = "stat".into();
    });
    broken.rejected_with(&["'\"legend\"' does not exist in type"]);
}

#[test]
fn a_datasource_uid_the_provisioning_does_not_define_is_rejected() {
    let broken = Broken::new(|d| {
        panel(d, "Round")["datasource"]["uid"] = "prom-missing".into();
    });
    broken.rejected_with(&[
        "panels[0] (\"Round\").datasource: data source uid \"prom-missing\" is not defined by \
         the provisioning files in dashboards/provisioning (defined: uid \"prometheus\" (type \
         prometheus, name \"Prometheus\"))",
    ]);
}

#[test]
fn a_variable_used_but_not_declared_is_rejected() {
    let broken = Broken::new(|d| {
        let target = &mut panel(d, "Uplink / downlink bitrate")["targets"][0];
        target["expr"] =
            "rate(fedshard_uplink_bits_total{run=\"$run\",job=\"$job\"}[$__rate_interval])".into();
    });
    let stderr = broken.rejected_with(&[
        "(\"Uplink / downlink bitrate\").targets[0].expr: variable $job is used but not declared \
         in templating.list (declared: $datasource, $run)",
    ]);
    // `$run` is declared and `$__rate_interval` is a Grafana built-in: neither is reported.
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_provisioning_file_with_an_unknown_key_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    for kind in ["datasources", "dashboards"] {
        std::fs::create_dir_all(dir.path().join(kind)).unwrap();
    }
    let datasource = std::fs::read_to_string(format!("{PROVISIONING}/datasources/prometheus.yml"))
        .unwrap()
        .replace("isDefault: true", "isDefault: true\n    colour: red");
    std::fs::write(dir.path().join("datasources/prometheus.yml"), datasource).unwrap();
    std::fs::copy(
        format!("{PROVISIONING}/dashboards/fedshard.yml"),
        dir.path().join("dashboards/fedshard.yml"),
    )
    .unwrap();
    let out = check(&[Path::new(DASHBOARD)], dir.path());
    let stderr = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "datasources/prometheus.yml (as JSON): Object literal may only specify known \
             properties, and '\"colour\"' does not exist in type 'ProvisionedDatasource'"
        ),
        "{stderr}"
    );
}
