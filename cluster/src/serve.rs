//! A server node: the unchanged `Server` actor, a [`Gateway`] for its remote clients, and a
//! ractor_cluster node that client nodes connect to.

use crate::acceptor::{self, Limits};
use crate::error::Error;
use crate::gateway::{Gateway, GatewayArgs, GatewayMsg};
use crate::join::started;
use crate::metrics::ClusterMetrics;
use crate::model_spec::ModelSpec;
use crate::node::NodeSettings;
use crate::refusal::Refusals;
use crate::secret::Secret;
use crate::wire;
use fedshard_actors::record::Summary;
use fedshard_actors::server::{Federation, Server};
use fedshard_protocol::model::ModelState;
use ractor::Actor;
use ractor::rpc::CallResult;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;

/// The longest wait for one answer of the gateway while the server finishes.
const FAREWELL: Duration = Duration::from_secs(5);

pub struct ServeOptions {
    /// Where client nodes connect (the firewall port to open).
    pub listen: SocketAddr,
    pub secret: Secret,
    pub tls: Option<TlsAcceptor>,
    /// What a peer may hold before it authenticates.
    pub limits: Limits,
    /// Length of the model's `ModelState::to_bytes`, which sizes the frame limits.
    pub model_bytes: usize,
    /// The server's model, which every node's hello must match.
    pub model: ModelSpec,
    /// After the last round, how long the server waits at most for its nodes to hear that the
    /// run is over and leave, and for nodes lost during the run (a frozen or cut-off machine)
    /// to come back and hear it, rather than reconnect in vain until their own timeout.
    pub finish_grace: Duration,
    pub metrics: ClusterMetrics,
}

/// Serves `federation` to client nodes until its last round, and returns the final model and
/// summary, as `fedshard_actors::server::run` does with clients in the same process. The first
/// round starts once every client of the federation has registered; a resumed federation
/// continues after its last checkpointed round.
pub async fn serve(
    options: ServeOptions,
    federation: Federation,
) -> Result<(ModelState, Summary), Error> {
    let expected = federation
        .registry
        .clients
        .iter()
        .map(|(&id, record)| (id, record.samples))
        .collect();
    let deadline = federation.config.deadline;
    let recipe = federation.config.recipe.clone();
    let (done, finished) = oneshot::channel();
    let (server, server_handle) = Actor::spawn(None, Server, (federation, done))
        .await
        .map_err(|e| started("server", e))?;
    let gateway = Actor::spawn(
        None,
        Gateway,
        GatewayArgs {
            server: server.clone(),
            expected,
            deadline,
            frame_limit: wire::frame_limit(options.model_bytes),
            metrics: options.metrics.clone(),
            recipe,
            model: options.model.clone(),
        },
    )
    .await;
    let (gateway, gateway_handle) = match gateway {
        Ok(started) => started,
        Err(e) => {
            server.stop(None);
            return Err(started("gateway", e));
        }
    };
    let events = gateway.clone();
    let settings = NodeSettings {
        name: format!("fedshard-server-{:016x}", rand::random::<u64>()),
        secret: options.secret,
        listen: options.listen,
        tls: options.tls,
        max_frame: wire::transport_cap(options.model_bytes),
    };
    let refusals = Refusals::new(options.metrics.clone());
    let node = match acceptor::start(settings, options.limits, refusals, move |event| {
        let _ = events.cast(GatewayMsg::Session(event));
    })
    .await
    {
        Ok(node) => node,
        Err(e) => {
            gateway.stop(None);
            server.stop(None);
            return Err(e);
        }
    };
    tracing::info!("listening for client nodes on {}", options.listen);

    let result = match finished.await {
        Ok(result) => result.map_err(|e| Error::Federation(e.to_string())),
        Err(_) => Err(Error::NoResult),
    };
    let error = result.as_ref().err().map(ToString::to_string);
    let rounds = result
        .as_ref()
        .map_or(0, |(_, summary)| summary.rounds_completed);
    let told = gateway
        .call(
            |told| GatewayMsg::Finish {
                rounds,
                error,
                told,
            },
            Some(FAREWELL),
        )
        .await;
    if let Ok(CallResult::Success(_)) = told {
        let started = Instant::now();
        let mut said = false;
        while started.elapsed() < options.finish_grace {
            match gateway.call(GatewayMsg::Waiting, Some(FAREWELL)).await {
                Ok(CallResult::Success(0)) | Err(_) => break,
                Ok(CallResult::Success(n)) if !said => {
                    said = true;
                    tracing::info!(
                        "the run is over; waiting up to {} s for {n} node(s) to hear it \
                         (--finish-grace)",
                        options.finish_grace.as_secs_f64()
                    );
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    node.stop();
    gateway.stop(None);
    server.stop(None);
    let _ = gateway_handle.await;
    let _ = server_handle.await;
    result
}
