//! What a node could not do. Each variant names the thing (a file, an address, the server) and
//! what was expected of it, so the command line prints one line that says how to fix it.
//! Reasons from other libraries (the operating system, rustls, rcgen, ractor) are kept as their
//! text, which makes the type comparable and cloneable.

use crate::secret::{MAKE_ONE, SHORT};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The listening address cannot be bound; `hint` is the fix for a port in use.
    #[error("cannot listen for nodes on {address}: {reason}{hint}")]
    Listen {
        address: SocketAddr,
        reason: String,
        hint: &'static str,
    },
    /// The open-file limit leaves nothing for connections once the run's own are kept.
    #[error(
        "the open-file limit is {limit}, and a server of this federation keeps {reserve} \
         descriptors for its own files and sessions: raise it (`ulimit -n 4096` before \
         `fedshard serve`)"
    )]
    TooFewDescriptors { limit: u64, reserve: u64 },
    /// `--max-unauthenticated` above what the open-file limit leaves.
    #[error(
        "--max-unauthenticated {requested}: the open-file limit is {limit} and {reserve} \
         descriptors are kept for the run's own files and sessions, so at most {room} \
         connections may wait; lower it, or raise the limit (`ulimit -n`)"
    )]
    MaxUnauthenticatedOverLimit {
        requested: usize,
        limit: u64,
        reserve: u64,
        room: usize,
    },
    /// This node's own ractor_cluster node stopped.
    #[error("this node stopped {when}: {reason}")]
    NodeStopped { when: &'static str, reason: String },
    /// One of this node's actors (server, gateway, agent, relay, client host) did not start.
    #[error("{actor} failed to start: {reason}")]
    Start { actor: &'static str, reason: String },

    /// No shared secret was given.
    #[error(
        "a shared secret is required: give --secret-file FILE or set {var} (there is no \
         default; every node of the federation needs the same one)",
        var = crate::secret::ENV_VAR
    )]
    NoSecret,
    #[error("the secret is empty; make one: `{make_one}`", make_one = MAKE_ONE)]
    EmptySecret,
    #[error(
        "the secret is only {0} bytes, expected at least {short} random ones; make one: \
         `{make_one}`",
        short = SHORT,
        make_one = MAKE_ONE
    )]
    ShortSecret(usize),
    /// Long enough, but a pattern (`a` × 32) rather than random bytes.
    #[error(
        "the secret ({length} bytes) has only about {bits} bits of entropy, expected at least \
         128 bits (it repeats a few characters); make a random one: `{make_one}`",
        make_one = MAKE_ONE
    )]
    WeakSecret { bits: u32, length: usize },
    /// The secret file cannot be read, or what it holds is not a secret.
    #[error("secret file {}: {reason}", .path.display())]
    SecretFile { path: PathBuf, reason: String },
    #[error(
        "secret file {} is readable or writable by other users (mode {mode:o}); `chmod 600 {}`",
        .path.display(), .path.display()
    )]
    SecretExposed { path: PathBuf, mode: u32 },
    /// `$FEDSHARD_SECRET` holds no valid secret.
    #[error("${var}: {0}", var = crate::secret::ENV_VAR)]
    SecretVariable(Box<Error>),

    /// A PEM file (`what`: certificate, key, CA) that cannot be read or holds nothing usable.
    #[error("{what} {}: {reason}", .path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error(
        "certificate {} and key {} do not make a TLS identity: {reason}",
        .cert.display(), .key.display()
    )]
    Identity {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    /// rustls refused a configuration.
    #[error("TLS: {0}")]
    Tls(String),
    #[error("`{name}` is not a host name or IP address for TLS: {reason}")]
    ServerName { name: String, reason: String },
    #[error("--days: a certificate must be valid for at least one day")]
    NoValidity,
    #[error("--days {0}: at most {max} days (ten years); a shorter life limits a stolen key's", max = crate::tls::MAX_DAYS)]
    ValidityTooLong(u32),
    #[error("give at least one name (IP address or DNS name) for the certificate")]
    NoCertificateNames,
    /// A `--names` entry that is neither an IP address nor a DNS name.
    #[error("--names: `{name}` is not an IP address or a DNS name: {reason}")]
    CertificateName { name: String, reason: &'static str },
    /// `fedshard cert` into a folder that already holds certificates.
    #[error(
        "{} already holds {}: a new CA would replace the one every node trusts; give --force to \
         replace them, or another --out",
        .dir.display(), .files.join(", ")
    )]
    CertificatesExist { dir: PathBuf, files: Vec<String> },
    /// rcgen could not make a part (`what`) of the certificates.
    #[error("{what}: {reason}")]
    Certificate { what: &'static str, reason: String },
    /// A file this crate writes.
    #[error("{}: {reason}", .path.display())]
    Write { path: PathBuf, reason: String },

    /// A `--clients` list: an id that is not one.
    #[error("`{part}` in `{text}` is not a client id")]
    NotAClientId { part: String, text: String },
    #[error("`{part}` in `{text}`: the range is empty")]
    EmptyRange { part: String, text: String },
    #[error("`{part}` in `{text}`: more than a million clients")]
    TooManyClients { part: String, text: String },
    #[error("client {client} appears twice in `{text}`")]
    ClientTwice { client: u64, text: String },

    /// The server turned this node away for its flood limits (retried until the timeout).
    #[error(
        "the server at {0} turned this node away: too many connections were waiting to \
         authenticate there (its --max-unauthenticated or --max-unauthenticated-per-ip)"
    )]
    Busy(String),
    /// The server closed the connection without a byte (retried until the timeout).
    #[error(
        "the server at {0} closed the connection before answering this node's handshake: it is \
         likely refusing connections for load (too many waiting to authenticate there: its \
         log says which), or stopping"
    )]
    Unanswered(String),
    /// Nothing answers at the server's address.
    #[error("cannot reach the server at {0}")]
    Unreachable(String),
    /// The TLS handshake with the server failed; `hint` says the likely cause.
    #[error("TLS handshake with {address} failed: {reason} ({hint})")]
    TlsHandshake {
        address: String,
        reason: String,
        hint: &'static str,
    },
    #[error(
        "the server at {0} closed the connection before this node authenticated: this node's \
         secret is not the server's (or TLS is on at one end only, or the server wants a client \
         certificate: --tls-cert, --tls-key)"
    )]
    NotAuthenticated(String),
    #[error("the server at {server} did not complete the handshake within {seconds} s")]
    HandshakeTimeout { server: String, seconds: u64 },
    /// The last reason the server could not be reached, once the time to try is spent.
    #[error("{last} (tried for {seconds} s)")]
    GaveUp { last: Box<Error>, seconds: u64 },
    #[error("the server refused this node: {0}")]
    Refused(String),
    #[error("the run failed on the server: {0}")]
    ServerFailed(String),
    #[error("the agent stopped")]
    AgentStopped,

    /// The federation itself failed (the round engine's reason).
    #[error("{0}")]
    Federation(String),
    #[error("server stopped without a result")]
    NoResult,
}
