//! The one record builder: whatever the schedule, what happened since the last model version is
//! counted into a [`Tally`] as it happens and summed up by [`record`].

use super::{Accepted, Classified, Folded, Tasks, Validated};
use crate::record::{KlmsStats, PhaseSeconds, RoundRecord, SimulatedTime};
use fedshard_protocol::payload::RejectionKind;
use fedshard_protocol::shard_plan::ShardPlan;
use fedshard_protocol::task::{ClientId, Evaluation};
use std::collections::{BTreeMap, BTreeSet};

/// The counts of a round (or of the hand-outs and answers behind one asynchronous version).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    /// Tasks whose answers count: a round's participants, or the answers taken in async mode.
    pub participants: usize,
    /// Bits of every task handed out, on the downlink.
    pub downlink_bits: u64,
    pub failures: BTreeMap<super::FailureKind, usize>,
    pub rejected: BTreeMap<RejectionKind, usize>,
    /// Uplink bits of every envelope received, summed per client.
    pub client_uplink_bits: BTreeMap<ClientId, u64>,
    /// Envelopes received.
    pub envelopes: usize,
    /// Where the simulated time went (with a clock).
    pub time: Option<SimulatedTime>,
}

impl Tally {
    /// Counts the tasks of a round as handed out.
    pub fn hand_out(&mut self, tasks: &Tasks) {
        self.downlink_bits += tasks.downlink_bits();
    }

    /// Counts a phase's sorted answers: each envelope's bits and each failure's kind.
    pub fn answers(&mut self, answers: &Classified) {
        for (id, e) in &answers.envelopes {
            *self.client_uplink_bits.entry(*id).or_default() += e.payload.bits;
        }
        self.envelopes += answers.envelopes.len();
        for f in answers.failures.values() {
            *self.failures.entry(f.kind).or_default() += 1;
        }
    }

    /// Counts an update rejected by its checks.
    pub fn reject(&mut self, kind: RejectionKind) {
        *self.rejected.entry(kind).or_default() += 1;
    }

    /// Counts every rejection of a round's validation.
    pub fn rejected(&mut self, validated: &Validated) {
        for (kind, n) in &validated.rejected {
            *self.rejected.entry(*kind).or_default() += n;
        }
    }
}

/// Everything a record is made of.
#[derive(Debug, Clone)]
pub struct RoundSummary<'a> {
    pub round: u64,
    pub tally: &'a Tally,
    /// The accepted updates, in the order they were folded.
    pub accepted: &'a [&'a Accepted],
    pub folded: &'a Folded,
    pub plan: Option<&'a ShardPlan>,
    pub evaluation: Evaluation,
    pub parameters: usize,
    pub learning_rate: f64,
    pub seconds: f64,
    /// [`super::update_cosine`] of the round (`None` when the model did not change).
    pub update_cosine: Option<f64>,
    /// Clients still training when an over-committed round closed.
    pub late: usize,
    /// The staleness τ of each buffered update, in buffer order (empty for a round).
    pub staleness: Vec<u64>,
    pub phases: PhaseSeconds,
    /// What a private release spent ([`crate::round::Private`]); `None` without privacy.
    pub privacy: Option<crate::privacy::PrivacyRecord>,
    /// A secure round's finished session: its survivors are the round's successes.
    pub secure: Option<crate::secure::SessionRecord>,
    /// The run's byzantine clients (`[faults.byzantine]`; empty without): the record counts
    /// those among the accepted updates.
    pub byzantine: &'a BTreeSet<ClientId>,
}

/// The [`RoundRecord`]: counts by kind, bits on both links, losses and timings.
pub fn record(s: RoundSummary<'_>) -> RoundRecord {
    let accepted = s.accepted;
    let mut rejected = s.tally.rejected.clone();
    if *s.folded == Folded::NonFinite {
        *rejected
            .entry(RejectionKind::NonFiniteAggregate)
            .or_default() += 1;
    }
    let uplink_bits: u64 = s.tally.client_uplink_bits.values().sum();
    let train_loss = if accepted.is_empty() {
        f64::NAN
    } else {
        accepted.iter().map(|a| a.loss).sum::<f64>() / accepted.len() as f64
    };
    let (anme, groups) = s
        .plan
        .map_or((0.0, vec![]), |p| (p.anme(), p.groups.clone()));
    RoundRecord {
        round: s.round,
        participants: s.tally.participants,
        successes: s.secure.map_or(accepted.len(), |session| session.survivors),
        failures: s.tally.failures.clone(),
        rejected,
        model_updated: *s.folded == Folded::Updated,
        accuracy: s.evaluation.accuracy,
        loss: s.evaluation.loss,
        train_loss,
        uplink_bits,
        client_uplink_bits: s.tally.client_uplink_bits.clone(),
        downlink_bits: s.tally.downlink_bits,
        bits_per_parameter: if s.tally.envelopes == 0 {
            0.0
        } else {
            uplink_bits as f64 / s.parameters.max(1) as f64 / s.tally.envelopes as f64
        },
        anme,
        groups,
        learning_rate: s.learning_rate,
        client_train_seconds: accepted.iter().map(|a| a.train_seconds).collect(),
        seconds: s.seconds,
        update_cosine: s.update_cosine,
        late: s.late,
        byzantine: accepted
            .iter()
            .filter(|a| s.byzantine.contains(&a.client))
            .count(),
        staleness: s.staleness,
        phases: s.phases,
        klms: KlmsStats::of(accepted.iter().filter_map(|a| a.update.side.as_ref())),
        time: s.tally.time.clone(),
        privacy: s.privacy,
        secure: s.secure,
    }
}
