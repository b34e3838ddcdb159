//! Headless Chromium for the tests that look at a page as a person would (Prometheus's graph
//! page, fedshard's live page): a screenshot, and the DOM after the page's scripts ran.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const CHROMIUM_HINT: &str = "this test drives headless Chromium: install it (Debian: \
    `apt-get install chromium`; Ubuntu: the `chromium` snap or Google Chrome as `chromium` on \
    PATH) or run `cargo xtask test`, which installs it";

/// Each Chromium run is bounded to this.
const LIMIT: Duration = Duration::from_secs(90);

/// `target/test-artefacts/`, created: where tests leave files for a person to look at.
pub fn artefacts() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap();
    let dir = target.join("test-artefacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Headless Chromium on `url` in a `width`×`height` window, its profile and log in `tmp`.
/// `budget_ms` is virtual time: timers (a page's refresh) run as fast as the page's fetches
/// allow, which still take real time, and the page is read once the budget is spent or nothing
/// is left to do.
pub struct Chromium<'a> {
    pub tmp: &'a Path,
    pub width: u32,
    pub height: u32,
    pub budget_ms: u64,
}

impl Chromium<'_> {
    /// Saves a screenshot of `url` at `png`.
    pub fn screenshot(&self, url: &str, png: &Path) -> Result<(), String> {
        self.run(&format!("--screenshot={}", png.display()), url)
            .map(|_| ())
    }

    /// The DOM of `url` once its scripts ran.
    pub fn dom(&self, url: &str) -> Result<String, String> {
        let dom = self.run("--dump-dom", url)?;
        Ok(String::from_utf8_lossy(&dom).into_owned())
    }

    fn run(&self, mode: &str, url: &str) -> Result<Vec<u8>, String> {
        let log = self.tmp.join("chromium.log");
        let mut child = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
            ])
            .arg(format!("--window-size={},{}", self.width, self.height))
            .arg(format!("--virtual-time-budget={}", self.budget_ms))
            .arg(format!(
                "--user-data-dir={}",
                self.tmp.join("chromium").display()
            ))
            .arg(mode)
            .arg(url)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .map_err(|e| format!("cannot run `chromium` ({e}): is it on PATH? {CHROMIUM_HINT}"))?;
        let mut stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            stdout.read_to_end(&mut out).map(|_| out)
        });
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                break status;
            }
            if started.elapsed() > LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("chromium {mode} {url} took over {LIMIT:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let out = reader.join().unwrap().map_err(|e| e.to_string())?;
        if !status.success() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("chromium {mode} {url} failed ({status}): {log}"));
        }
        Ok(out)
    }
}
