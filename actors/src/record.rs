//! What a round reports: one [`RoundRecord`] per round, the single source for `metrics.jsonl`,
//! `metrics.csv`, the progress bar and the Prometheus metrics.

use crate::error::Error;
use crate::round::FailureKind;
use crate::run_folder::SUMMARY_FILE;
use fedshard_protocol::payload::RejectionKind;
use fedshard_protocol::shard_plan::GroupStats;
use fedshard_protocol::task::ClientId;
use fedshard_protocol::uplink::UplinkSide;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    pub round: u64,
    /// Clients asked to train.
    pub participants: usize,
    /// Updates accepted into the aggregate.
    pub successes: usize,
    /// Clients that failed, by kind (`error`, `panic`, `timeout`, `unreachable`).
    pub failures: BTreeMap<FailureKind, usize>,
    /// Updates rejected by validation, by kind (`malformed`, `shape`, `non_finite`, `indices`,
    /// `stale`, `forged`, `norm_bound` above `[federation] max_update_norm`), and
    /// `non_finite_aggregate` when the accepted updates summed past f32 (model unchanged).
    pub rejected: BTreeMap<RejectionKind, usize>,
    /// Whether the global model changed (false when below the minimum of successful clients).
    pub model_updated: bool,
    pub accuracy: f64,
    pub loss: f64,
    /// Mean local training loss of the accepted clients.
    pub train_loss: f64,
    pub uplink_bits: u64,
    /// The bits of each client's update on the wire, by client id: every envelope received this
    /// round, accepted or rejected (their sum is `uplink_bits`). Absent in histories written
    /// before it existed.
    #[serde(default)]
    pub client_uplink_bits: BTreeMap<ClientId, u64>,
    pub downlink_bits: u64,
    /// Uplink bits per model parameter per received update.
    pub bits_per_parameter: f64,
    pub anme: f64,
    pub groups: Vec<GroupStats>,
    pub learning_rate: f64,
    /// Seconds each accepted client spent training.
    pub client_train_seconds: Vec<f64>,
    pub seconds: f64,
    /// Cosine similarity between the applied update of the global model and the sample-weighted
    /// mean of the accepted clients' own updates in the full weight space
    /// ([`crate::round::update_cosine`]); `None` when the model did not change. Absent in
    /// histories written before it existed.
    #[serde(default)]
    pub update_cosine: Option<f64>,
    /// Clients cut off by over-commitment (`[federation] over_commit`): still training when the
    /// round had its updates, so their answers were dropped. Absent in older histories.
    #[serde(default)]
    pub late: usize,
    /// Updates of byzantine clients (`[faults.byzantine]`) among those accepted into the
    /// aggregate: what a robust aggregator had to resist this round. 0 in a secure round, whose
    /// updates the server only sees summed, and in older histories.
    #[serde(default)]
    pub byzantine: usize,
    /// In async mode, the staleness τ of each accepted update: how many model versions were
    /// applied between the one its client trained from and this one. Empty in synchronous
    /// rounds and in older histories.
    #[serde(default)]
    pub staleness: Vec<u64>,
    /// Where the round's `seconds` went. Zeros in async mode and in older histories.
    #[serde(default)]
    pub phases: PhaseSeconds,
    /// What the accepted clients' KLMS coders reported; `None` without a KLMS compressor (and
    /// absent in older histories). Always written: the checkpoint's bincode has no optional
    /// fields.
    #[serde(default)]
    pub klms: Option<KlmsStats>,
    /// Simulated time (`--clock virtual`, or stragglers with a `base_delay_ms`): the round's
    /// start and end and each answering client's download, compute and upload; `None` on the
    /// wall clock. Always written, as `klms`.
    #[serde(default)]
    pub time: Option<SimulatedTime>,
    /// With `[privacy]`, what this round's release spent (ε at δ after it) and how it clipped
    /// ([`crate::privacy::PrivacyRecord`]); `None` otherwise. Always written, as `klms`.
    #[serde(default)]
    pub privacy: Option<crate::privacy::PrivacyRecord>,
    /// With `[secure_aggregation]`, what the round's session came to (its survivors, dropped
    /// clients, threshold and modulus bits; [`crate::secure::SessionRecord`]); `None` otherwise
    /// or when it did not finish. Always written, as `klms`.
    #[serde(default)]
    pub secure: Option<crate::secure::SessionRecord>,
}

/// Where a round's (or an async version's) simulated time went, in seconds since the run began.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SimulatedTime {
    /// When its first task was sent (a round), or when the previous version was applied.
    pub start: f64,
    /// When its last answer was taken: the model version is applied then.
    pub end: f64,
    /// Each answering client's task.
    pub clients: BTreeMap<ClientId, crate::clock::TaskTime>,
}

/// A round's KLMS reports (docs/algorithms.md §4.4; `[compression] rescale_drift`, `report_drift`), so
/// that a run shows whether its blocks still carry about `d_target` bits of KL and how much of
/// the drift the candidates carried: the two numbers that explain a KLMS run's bits and
/// accuracy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct KlmsStats {
    /// Accepted clients that cut and uploaded their own block ends (`UPDATE` rounds).
    pub block_uploads: usize,
    /// Mean over the other accepted clients of their mean KL per block in bits, measured against
    /// the blocks they were sent (the broadcast ones, or their own with `block_scope =
    /// "client"`; a re-partition follows when it leaves `[D/3, 1.5 D]`); `None` when every
    /// client uploaded blocks, which are cut at about `d_target` bits each.
    pub block_kl_bits: Option<f64>,
    /// Mean over the accepted clients of the share `ρ` of their drift that the selected
    /// candidates carry, as they reported it (`rescale_drift`, where the server divides by it,
    /// or `report_drift`).
    pub drift_ratio: Option<f64>,
}

impl KlmsStats {
    /// The stats of a round's decoded uplinks, `None` when none of them was KLMS-coded.
    pub fn of<'a>(sides: impl IntoIterator<Item = &'a UplinkSide>) -> Option<Self> {
        let mean = |xs: &[f64]| (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64);
        let (mut uploads, mut kl, mut rho) = (0, Vec::new(), Vec::new());
        for side in sides {
            uploads += usize::from(side.ends.is_some());
            kl.extend(side.mean_kl_bits);
            rho.extend(side.drift_ratio);
        }
        (uploads > 0 || !kl.is_empty() || !rho.is_empty()).then(|| Self {
            block_uploads: uploads,
            block_kl_bits: mean(&kl),
            drift_ratio: mean(&rho),
        })
    }
}

/// Where a synchronous round's wall-clock seconds went, phase by phase; the rest of `seconds`
/// is the runtime's own messaging and bookkeeping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseSeconds {
    /// Selection, the sharding plan (each shardable layer's SVD and the draws) and the tasks.
    pub plan: f64,
    /// From sending the tasks to the last answer: the clients' local training, the transfers
    /// and the decoding (the slowest client sets it).
    pub train: f64,
    /// Validation, aggregation, the fold into the global model and the update cosine.
    pub aggregate: f64,
    /// Scoring the new global model on the held-out set.
    pub evaluate: f64,
}

impl PhaseSeconds {
    /// The phases in `metrics.csv` order, with their column names.
    pub fn columns(&self) -> [(&'static str, f64); 4] {
        [
            ("plan_seconds", self.plan),
            ("train_seconds", self.train),
            ("aggregate_seconds", self.aggregate),
            ("evaluate_seconds", self.evaluate),
        ]
    }
}

impl RoundRecord {
    pub fn failures_total(&self) -> usize {
        self.failures.values().sum()
    }

    pub fn rejected_total(&self) -> usize {
        self.rejected.values().sum()
    }

    /// This round as `metrics.csv`'s named cells, in column order. The header is the names of
    /// any record's cells, so a column and its cell are written side by side and cannot drift
    /// apart.
    ///
    /// The columns: the scalar fields under their JSON names; the maps `failures` and
    /// `rejected` flattened into a total and one column per kind (`failures_timeout`,
    /// `rejected_stale`, …, every kind always present, so rows of different rounds line up); the
    /// per-cluster `groups` as their count and the least and largest cluster ANME (`anme` is
    /// their mean); `client_train_seconds` as count, mean and maximum (the slowest client is
    /// what a deadline has to cover); `update_cosine`, empty when the model did not change; then
    /// `late`, `byzantine` and the mean and largest `staleness` (empty in synchronous rounds); the
    /// [`KlmsStats`] as `klms_block_uploads`, `klms_block_kl_bits` and `klms_drift_ratio` (empty
    /// without KLMS, and where no client reported the value); then the [`PhaseSeconds`].
    ///
    /// Every cell is a number or `true`/`false`. A non-finite float (the train loss of a round
    /// with no accepted update is NaN) is an empty cell, as it is `null` in `metrics.jsonl`;
    /// finite floats are written in Rust's shortest round-trip form, so a cell parses back to
    /// the very value of the JSON line.
    pub fn csv_cells(&self) -> Vec<(Cow<'static, str>, String)> {
        let count = |n: usize| n.to_string();
        let named = |name: &'static str, cell: String| (Cow::Borrowed(name), cell);
        let mut cells = vec![
            named("round", self.round.to_string()),
            named("participants", count(self.participants)),
            named("successes", count(self.successes)),
            named("failures_total", count(self.failures_total())),
        ];
        cells.extend(FailureKind::ALL.map(|kind| {
            (
                Cow::Owned(format!("failures_{}", kind.label())),
                count(self.failures.get(&kind).copied().unwrap_or(0)),
            )
        }));
        cells.push(named("rejected_total", count(self.rejected_total())));
        cells.extend(RejectionKind::ALL.map(|kind| {
            (
                Cow::Owned(format!("rejected_{}", kind.label())),
                count(self.rejected.get(&kind).copied().unwrap_or(0)),
            )
        }));
        let group_anme = || self.groups.iter().map(|g| g.anme);
        let seconds = &self.client_train_seconds;
        let klms = self.klms.as_ref();
        cells.extend([
            named("model_updated", self.model_updated.to_string()),
            named("accuracy", csv_float(self.accuracy)),
            named("loss", csv_float(self.loss)),
            named("train_loss", csv_float(self.train_loss)),
            named("uplink_bits", self.uplink_bits.to_string()),
            named("downlink_bits", self.downlink_bits.to_string()),
            named("bits_per_parameter", csv_float(self.bits_per_parameter)),
            named("anme", csv_float(self.anme)),
            named("groups", count(self.groups.len())),
            named(
                "groups_anme_min",
                csv_float(group_anme().fold(f64::NAN, f64::min)),
            ),
            named(
                "groups_anme_max",
                csv_float(group_anme().fold(f64::NAN, f64::max)),
            ),
            named("learning_rate", csv_float(self.learning_rate)),
            named("client_train_seconds_count", count(seconds.len())),
            named(
                "client_train_seconds_mean",
                csv_float(seconds.iter().sum::<f64>() / seconds.len() as f64),
            ),
            named(
                "client_train_seconds_max",
                csv_float(seconds.iter().copied().fold(f64::NAN, f64::max)),
            ),
            named("seconds", csv_float(self.seconds)),
            named(
                "update_cosine",
                csv_float(self.update_cosine.unwrap_or(f64::NAN)),
            ),
            named("late", count(self.late)),
            named("byzantine", count(self.byzantine)),
            named(
                "staleness_mean",
                csv_float(self.staleness.iter().sum::<u64>() as f64 / self.staleness.len() as f64),
            ),
            named(
                "staleness_max",
                self.staleness
                    .iter()
                    .max()
                    .map_or(String::new(), u64::to_string),
            ),
            named(
                "klms_block_uploads",
                klms.map_or(String::new(), |k| count(k.block_uploads)),
            ),
            named(
                "klms_block_kl_bits",
                csv_float(klms.and_then(|k| k.block_kl_bits).unwrap_or(f64::NAN)),
            ),
            named(
                "klms_drift_ratio",
                csv_float(klms.and_then(|k| k.drift_ratio).unwrap_or(f64::NAN)),
            ),
        ]);
        cells.extend(
            self.phases
                .columns()
                .map(|(name, s)| named(name, csv_float(s))),
        );
        cells
    }
}

/// Writes `records` as lines of `metrics.csv` through the csv crate, after the header when
/// `header` is set. The writer refuses a row whose length differs from the header's.
fn write_csv<'a>(
    out: impl std::io::Write,
    header: bool,
    records: impl IntoIterator<Item = &'a RoundRecord>,
) -> std::io::Result<()> {
    let mut writer = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(out);
    if header {
        let names = RoundRecord::default().csv_cells();
        writer.write_record(names.iter().map(|(name, _)| name.as_bytes()))?;
    }
    for record in records {
        writer.write_record(record.csv_cells().iter().map(|(_, cell)| cell))?;
    }
    writer.flush()
}

/// A whole `metrics.csv`: the header and one line per round of `history`.
pub fn csv_document(history: &[RoundRecord]) -> Vec<u8> {
    let mut bytes = Vec::new();
    // Writing into memory fails only on a row of the wrong length, which `csv_cells` cannot
    // produce (every record has the same columns).
    write_csv(&mut bytes, true, history).expect("every record has the header's columns");
    bytes
}

/// Appends `record`'s line to `path`, writing the header first when the file is new or empty,
/// so a run folder's CSV grows round by round like `metrics.jsonl` (a resumed run rewrites both
/// whole with [`csv_document`]).
pub fn append_csv_row(path: &Path, record: &RoundRecord) -> Result<(), Error> {
    let failed = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(failed)?;
    let empty = file.metadata().map_err(failed)?.len() == 0;
    // One write of the whole line (and header), as before: an interrupted run leaves whole rows.
    let mut line = Vec::new();
    write_csv(&mut line, empty, [record]).map_err(failed)?;
    file.write_all(&line).map_err(failed)
}

/// A float cell: empty for NaN and infinities, which CSV has no agreed spelling for.
fn csv_float(value: f64) -> String {
    if value.is_finite() {
        value.to_string()
    } else {
        String::new()
    }
}

/// `summary.json` of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub rounds_completed: u64,
    pub final_accuracy: f64,
    pub final_loss: f64,
    pub uplink_bits_total: u64,
    pub downlink_bits_total: u64,
    pub failures_total: usize,
    pub rejected_total: usize,
    pub seconds_total: f64,
    pub per_round: Vec<RoundRecord>,
    /// With `[privacy]`, the run's ε at δ and the mechanism it was accounted as; absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privacy: Option<crate::privacy::PrivacySummary>,
}

impl Summary {
    /// Writes the summary to `dir`'s [`SUMMARY_FILE`], atomically.
    pub fn save(&self, dir: &Path) -> Result<(), Error> {
        let text = serde_json::to_string_pretty(self)?;
        crate::checkpoint::write_atomically(&dir.join(SUMMARY_FILE), text.as_bytes())?;
        Ok(())
    }

    pub fn from_history(history: &[RoundRecord]) -> Self {
        let last = history.last();
        Self {
            rounds_completed: last.map_or(0, |r| r.round),
            final_accuracy: last.map_or(f64::NAN, |r| r.accuracy),
            final_loss: last.map_or(f64::NAN, |r| r.loss),
            uplink_bits_total: history.iter().map(|r| r.uplink_bits).sum(),
            downlink_bits_total: history.iter().map(|r| r.downlink_bits).sum(),
            failures_total: history.iter().map(RoundRecord::failures_total).sum(),
            rejected_total: history.iter().map(RoundRecord::rejected_total).sum(),
            seconds_total: history.iter().map(|r| r.seconds).sum(),
            per_round: history.to_vec(),
            privacy: None,
        }
    }

    /// Adds the `privacy` block of a run with `settings` (nothing without them).
    pub fn with_privacy(mut self, settings: Option<&crate::privacy::PrivacySettings>) -> Self {
        self.privacy = crate::privacy::PrivacySummary::of(settings, &self.per_round);
        self
    }

    /// Uplink bits per parameter per received update, averaged over the rounds (`None` for a
    /// run without rounds): the figure `fedshard compare --compressors` reports.
    pub fn mean_bits_per_parameter(&self) -> Option<f64> {
        let rounds = &self.per_round;
        (!rounds.is_empty())
            .then(|| rounds.iter().map(|r| r.bits_per_parameter).sum::<f64>() / rounds.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klms_stats_average_what_the_clients_reported() {
        let side = |ends: Option<Vec<usize>>, kl: Option<f64>, rho: Option<f64>| UplinkSide {
            len: 8,
            ends,
            mean_kl_bits: kl,
            symbols: None,
            drift_ratio: rho,
        };
        assert_eq!(KlmsStats::of(&[UplinkSide::default()]), None, "no KLMS");
        let sides = [
            side(Some(vec![4, 8]), None, Some(0.8)),
            side(None, Some(1.5), Some(1.0)),
            side(None, Some(2.5), None),
        ];
        let stats = KlmsStats {
            block_uploads: 1,
            block_kl_bits: Some(2.0),
            drift_ratio: Some(0.9),
        };
        assert_eq!(KlmsStats::of(&sides), Some(stats));
        // `null` without KLMS, and read back.
        let mut r = record();
        assert!(
            serde_json::to_string(&r)
                .unwrap()
                .contains(r#""klms":null"#)
        );
        r.klms = Some(stats);
        let line = serde_json::to_string(&r).unwrap();
        assert!(
            line.contains(r#""klms":{"block_uploads":1,"block_kl_bits":2.0,"drift_ratio":0.9}"#)
        );
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        let read: KlmsStats = serde_json::from_value(value["klms"].clone()).unwrap();
        assert_eq!(read, stats);
    }

    fn record() -> RoundRecord {
        RoundRecord {
            round: 3,
            participants: 5,
            successes: 3,
            failures: BTreeMap::from([(FailureKind::Timeout, 1)]),
            rejected: BTreeMap::from([(RejectionKind::Stale, 1)]),
            model_updated: true,
            accuracy: 0.875,
            loss: 0.4,
            train_loss: f64::NAN,
            uplink_bits: 12_000,
            client_uplink_bits: BTreeMap::from([(1, 4_000), (2, 8_000)]),
            downlink_bits: 48_000,
            bits_per_parameter: 32.0,
            anme: 0.25,
            groups: [0.1, 0.4]
                .map(|anme| GroupStats {
                    layer: "fc0.weight".into(),
                    keep_ratio: 0.4,
                    clients: 2,
                    kept: 4,
                    anme,
                    expected_discrepancy: None,
                })
                .to_vec(),
            learning_rate: 0.05,
            client_train_seconds: vec![1.0, 2.0, 6.0],
            seconds: 7.5,
            update_cosine: Some(0.5),
            late: 0,
            byzantine: 0,
            klms: None,
            time: None,
            privacy: None,
            secure: None,
            staleness: vec![],
            phases: PhaseSeconds {
                plan: 0.001,
                train: 0.5,
                aggregate: 0.01,
                evaluate: 0.002,
            },
        }
    }

    /// The cells of `record` by column name.
    fn cells(record: &RoundRecord) -> BTreeMap<String, String> {
        let cells = record.csv_cells();
        let named: BTreeMap<String, String> = cells
            .iter()
            .map(|(name, cell)| (name.to_string(), cell.clone()))
            .collect();
        assert_eq!(named.len(), cells.len(), "duplicate column");
        named
    }

    /// `metrics.csv` byte for byte as the hand-written writer wrote it before the csv crate
    /// wrote it (the header, a round with every kind of cell, and one with empty, huge, tiny,
    /// negative-zero and long floats): the file did not change.
    #[test]
    fn metrics_csv_keeps_its_bytes() {
        const ORACLE: &str = concat!(
            "round,participants,successes,failures_total,failures_error,failures_panic,",
            "failures_timeout,failures_unreachable,rejected_total,rejected_malformed,",
            "rejected_shape,rejected_non_finite,rejected_indices,rejected_stale,",
            "rejected_forged,rejected_non_finite_aggregate,rejected_norm_bound,model_updated,",
            "accuracy,loss,train_loss,uplink_bits,downlink_bits,bits_per_parameter,anme,",
            "groups,groups_anme_min,groups_anme_max,learning_rate,client_train_seconds_count,",
            "client_train_seconds_mean,client_train_seconds_max,seconds,update_cosine,late,",
            "byzantine,staleness_mean,staleness_max,klms_block_uploads,klms_block_kl_bits,",
            "klms_drift_ratio,plan_seconds,train_seconds,aggregate_seconds,evaluate_seconds\n",
            "3,5,3,1,0,0,1,0,1,0,0,0,0,1,0,0,0,true,0.875,0.4,,12000,48000,32,0.25,2,0.1,0.4,",
            "0.05,3,3,6,7.5,0.5,0,0,,,,,,0.001,0.5,0.01,0.002\n",
            "4,5,3,9,2,0,0,7,3,0,0,0,0,0,0,0,3,false,0.0000001,1000000000000000000000,2.5,",
            "12000,48000,32,0.25,2,0.1,0.4,0.30000000000000004,3,3,6,,,2,1,3.5,5,0,-0,,0.001,",
            "0.5,0.01,0.002\n",
        );
        let odd = RoundRecord {
            round: 4,
            failures: BTreeMap::from([(FailureKind::Error, 2), (FailureKind::Unreachable, 7)]),
            rejected: BTreeMap::from([(RejectionKind::NormBound, 3)]),
            model_updated: false,
            accuracy: 1e-7,
            loss: 1e21,
            train_loss: 2.5,
            learning_rate: 0.1 + 0.2,
            seconds: f64::NAN,
            update_cosine: None,
            late: 2,
            byzantine: 1,
            staleness: vec![2, 5],
            klms: Some(KlmsStats {
                block_uploads: 0,
                block_kl_bits: Some(-0.0),
                drift_ratio: None,
            }),
            ..record()
        };
        let history = [record(), odd];
        assert_eq!(String::from_utf8(csv_document(&history)).unwrap(), ORACLE);
    }

    /// Maps are flattened with a column per kind (zero for the kinds that did not occur), lists
    /// summarised, NaN left empty.
    #[test]
    fn a_row_names_each_cell() {
        let cells = cells(&record());
        let expected = [
            ("round", "3"),
            ("failures_total", "1"),
            ("failures_timeout", "1"),
            ("failures_panic", "0"),
            ("rejected_total", "1"),
            ("rejected_stale", "1"),
            ("rejected_non_finite_aggregate", "0"),
            ("model_updated", "true"),
            ("accuracy", "0.875"),
            ("train_loss", ""),
            ("uplink_bits", "12000"),
            ("bits_per_parameter", "32"),
            ("groups", "2"),
            ("groups_anme_min", "0.1"),
            ("groups_anme_max", "0.4"),
            ("client_train_seconds_count", "3"),
            ("client_train_seconds_mean", "3"),
            ("client_train_seconds_max", "6"),
            ("seconds", "7.5"),
            ("update_cosine", "0.5"),
            ("rejected_norm_bound", "0"),
        ];
        for (column, value) in expected {
            assert_eq!(cells[column], value, "column {column}");
        }
    }

    /// A round with no accepted client has no train-time mean or maximum: empty cells, not NaN.
    #[test]
    fn empty_lists_give_empty_cells() {
        let mut r = record();
        r.client_train_seconds.clear();
        r.groups.clear();
        let row = cells(&r);
        for column in [
            "client_train_seconds_mean",
            "client_train_seconds_max",
            "groups_anme_min",
        ] {
            assert_eq!(row[column], "", "column {column}");
        }
        assert_eq!(row["groups"], "0");
        for column in [
            "klms_block_uploads",
            "klms_block_kl_bits",
            "klms_drift_ratio",
        ] {
            assert_eq!(row[column], "", "no KLMS: column {column}");
        }
        r.klms = Some(KlmsStats {
            block_uploads: 2,
            block_kl_bits: None,
            drift_ratio: Some(0.93),
        });
        let row = cells(&r);
        assert_eq!(
            [
                row["klms_block_uploads"].as_str(),
                &row["klms_block_kl_bits"],
                &row["klms_drift_ratio"]
            ],
            ["2", "", "0.93"]
        );
        // A round that left the model unchanged has no cosine.
        let row = cells(&RoundRecord {
            update_cosine: None,
            ..record()
        });
        assert_eq!(row["update_cosine"], "");
    }

    #[test]
    fn appending_writes_the_header_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(crate::run_folder::CSV_FILE);
        let mut history = vec![record()];
        append_csv_row(&path, &history[0]).unwrap();
        history.push(RoundRecord {
            round: 4,
            ..record()
        });
        append_csv_row(&path, &history[1]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.as_bytes(), csv_document(&history));
        assert_eq!(text.lines().count(), 3);
        // A history written before `update_cosine` existed still loads.
        let finite = RoundRecord {
            train_loss: 1.0,
            ..record()
        };
        let mut old = serde_json::to_value(finite).unwrap();
        old.as_object_mut().unwrap().remove("update_cosine");
        let back: RoundRecord = serde_json::from_value(old).unwrap();
        assert_eq!(back.update_cosine, None);
        let err = append_csv_row(&dir.path().join("missing/metrics.csv"), &record()).unwrap_err();
        assert!(err.to_string().contains("missing/metrics.csv"), "{err}");
    }
}
