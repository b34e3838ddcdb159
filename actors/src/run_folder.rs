//! The files of a run folder, named once. The server writes the checkpoint and the per-round
//! records as each round ends; `fedshard run` and `serve` write the config a run started with,
//! the final model and the summary; `report`, `eval`, the live page and a resumed run read them.

/// The config the run was started with; a resumed run reads it back.
pub const CONFIG_FILE: &str = "config.toml";
/// Everything needed to continue the run exactly (`checkpoint::save`, a checked header, then the
/// checkpoint).
pub const CHECKPOINT_FILE: &str = "checkpoint.bin";
/// One JSON record per round, appended as each round ends.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The spreadsheet twin of [`METRICS_FILE`].
pub const CSV_FILE: &str = "metrics.csv";
/// The end-of-run summary, whose `per_round` holds the same records.
pub const SUMMARY_FILE: &str = "summary.json";
/// Under SCAFFOLD, the folder of the clients' control variates that this node hosts (one file a
/// client, `crate::variates`); a node that joins a run keeps its own.
pub const VARIATES_DIR: &str = "variates";
/// The final global model, as `ModelState::to_file_bytes` (a checked header, then the model).
pub const MODEL_FILE: &str = "model.bin";
