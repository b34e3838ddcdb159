//! What the end-to-end tests need besides Rust, and installing it when it is missing.
//!
//! `tests/prometheus.rs` starts a real `prometheus` and drives headless `chromium`;
//! `tests/dashboards.rs` runs `scripts/dashboard-schema/check.sh`, which needs `node` and `npm`
//! and the pinned npm packages; `tests/netns.rs` makes network namespaces with iproute2's `ip`
//! and `tc` (and needs root). Those tests fail (never skip) without them, so a newcomer's
//! `cargo xtask test` installs them first, or stops before testing and says what to run.

use std::env;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// A program the tests run, and the Debian/Ubuntu package that provides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    pub command: &'static str,
    pub package: &'static str,
}

pub const TOOLS: [Tool; 5] = [
    Tool {
        command: "prometheus",
        package: "prometheus",
    },
    Tool {
        command: "chromium",
        package: "chromium",
    },
    Tool {
        command: "node",
        package: "nodejs",
    },
    Tool {
        command: "npm",
        package: "npm",
    },
    Tool {
        command: "ip",
        package: "iproute2",
    },
];

/// Whether `command` is an executable file in one of the directories of `path` (a `PATH` value).
pub fn on_path(command: &str, path: &OsStr) -> bool {
    env::split_paths(path).any(|dir| {
        fs::metadata(dir.join(command))
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// The tools of `tools` that `path` lacks, in order.
pub fn missing(tools: &[Tool], path: &OsStr) -> Vec<Tool> {
    tools
        .iter()
        .copied()
        .filter(|t| !on_path(t.command, path))
        .collect()
}

/// How this user may install system packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rights {
    Root,
    /// `sudo -n` works: sudo without a password.
    Sudo,
    None,
}

fn rights() -> Rights {
    let uid = Command::new("id").arg("-u").output();
    if uid.is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "0") {
        return Rights::Root;
    }
    let sudo = Command::new("sudo")
        .args(["-n", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if sudo.is_ok_and(|s| s.success()) {
        Rights::Sudo
    } else {
        Rights::None
    }
}

/// The `apt-get install` command line for `packages`, as a user would type it.
pub fn install_line(packages: &[&str], rights: Rights) -> String {
    let sudo = if rights == Rights::Root { "" } else { "sudo " };
    format!(
        "{sudo}apt-get install -y --no-install-recommends {}",
        packages.join(" ")
    )
}

/// Installs the missing tools when it can, then the pinned dashboard-schema packages; an `Err`
/// is the one message to print, naming the command that would get the user going.
pub fn ensure(repo: &Path, target: &Path) -> Result<(), String> {
    let path = env::var_os("PATH").unwrap_or_default();
    let missing = missing(&TOOLS, &path);
    let packages: Vec<&str> = missing.iter().map(|t| t.package).collect();
    if packages.is_empty() {
        println!("cargo xtask test: prometheus, chromium, node, npm and iproute2 are installed");
    } else {
        let rights = rights();
        let line = install_line(&packages, rights);
        if rights == Rights::None || !on_path("apt-get", &path) {
            return Err(format!(
                "the end-to-end tests need {} (not on PATH), and this user cannot install them \
                 (it needs root or sudo without a password, and apt-get); install them with \
                 `{line}` (elsewhere: your package manager's prometheus, chromium, Node.js >= 18, \
                 npm and iproute2), then run `cargo xtask test` again",
                packages.join(", "),
                line = install_line(&packages, Rights::Sudo),
            ));
        }
        println!(
            "cargo xtask test: installing {} (`{line}`)",
            packages.join(", ")
        );
        apt(repo, target, &packages, rights)?;
        let still = crate::deps::missing(&missing, &env::var_os("PATH").unwrap_or_default());
        if !still.is_empty() {
            let names: Vec<&str> = still.iter().map(|t| t.command).collect();
            return Err(format!(
                "`{line}` succeeded but {} is still not on PATH",
                names.join(", ")
            ));
        }
    }
    let schema = repo.join("scripts/dashboard-schema/check.sh");
    let status = Command::new(&schema)
        .arg("--install")
        .current_dir(repo)
        .env(
            "FEDSHARD_DASHBOARD_SCHEMA_CACHE",
            target.join("tmp/dashboard-schema"),
        )
        .status()
        .map_err(|e| format!("cannot run {}: {e}", schema.display()))?;
    if !status.success() {
        return Err(format!(
            "`scripts/dashboard-schema/check.sh --install` failed ({status}); it says why above"
        ));
    }
    Ok(())
}

/// `apt-get update` and `apt-get install`, quietly: their output goes to
/// `TARGET/xtask/apt.log`, which a failure points to.
fn apt(repo: &Path, target: &Path, packages: &[&str], rights: Rights) -> Result<(), String> {
    let dir = target.join("xtask");
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let log_path = dir.join("apt.log");
    let log = File::create(&log_path)
        .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
    let install: Vec<&str> = ["install", "-y", "--no-install-recommends"]
        .into_iter()
        .chain(packages.iter().copied())
        .collect();
    for args in [vec!["update"], install] {
        let mut command = match rights {
            Rights::Root => Command::new("apt-get"),
            _ => {
                let mut sudo = Command::new("sudo");
                sudo.args(["-n", "--preserve-env=DEBIAN_FRONTEND", "apt-get"]);
                sudo
            }
        };
        let out = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let status = command
            .args(&args)
            .current_dir(repo)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`apt-get {}` failed ({status}); its output is in {}",
                args.join(" "),
                log_path.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh folder holding an executable `node` and a non-executable `npm`.
    fn fake_bin(name: &str) -> PathBuf {
        let dir = env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("temp dir");
        fs::write(dir.join("node"), "#!/bin/sh\n").expect("write node");
        fs::set_permissions(dir.join("node"), fs::Permissions::from_mode(0o755)).expect("chmod");
        fs::write(dir.join("npm"), "not executable").expect("write npm");
        dir
    }

    #[test]
    fn only_executable_files_count_as_installed() {
        let dir = fake_bin("on-path");
        let path = env::join_paths([Path::new("/nonexistent-xtask"), &dir]).expect("join");
        assert!(on_path("node", &path));
        assert!(
            !on_path("npm", &path),
            "a file without the executable bit is not a program"
        );
        assert!(!on_path("prometheus", &path));
        let gone: Vec<&str> = missing(&TOOLS, &path).iter().map(|t| t.package).collect();
        assert_eq!(gone, ["prometheus", "chromium", "npm", "iproute2"]);
        fs::remove_dir_all(dir).expect("clean up");
    }

    #[test]
    fn the_install_line_uses_sudo_unless_root() {
        assert_eq!(
            install_line(&["prometheus", "chromium"], Rights::Root),
            "apt-get install -y --no-install-recommends prometheus chromium"
        );
        assert_eq!(
            install_line(&["npm"], Rights::Sudo),
            "sudo apt-get install -y --no-install-recommends npm"
        );
    }
}
