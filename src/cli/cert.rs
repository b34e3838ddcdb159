//! `fedshard cert`: a private CA and a node certificate for TLS between nodes, so a federation
//! (or a test) needs no openssl recipe. Keys are written readable by their owner only.

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CertArgs {
    /// Folder for `ca.pem`, `ca-key.pem`, `node.pem`, `node-key.pem`.
    #[arg(long)]
    pub out: PathBuf,
    /// The server's names as client nodes dial it: IP addresses and DNS names, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub names: Vec<String>,
    /// Days the CA and the node certificate stay valid (from a day before now, for clock skew).
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// Replace certificates already in `--out` (a new CA: every node must get the new `ca.pem`).
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: &CertArgs) -> anyhow::Result<()> {
    let files = fedshard_cluster::tls::generate(&args.out, &args.names, args.days, args.force)
        .map_err(anyhow::Error::msg)?;
    eprintln!(
        "wrote {} (give it to every node: --tls-ca), {} and {} (the server: --tls-cert, \
         --tls-key), and the CA's key {} (keep it offline); valid for {} days",
        files.ca_cert.display(),
        files.node_cert.display(),
        files.node_key.display(),
        files.ca_key.display(),
        args.days
    );
    Ok(())
}
