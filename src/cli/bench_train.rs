//! `fedshard bench train`: local-training throughput of each model on this machine, in samples
//! per second of SGD (forward, backward, Frobenius decay, momentum step), dense and sharded.
//!
//! It reports only what it measures on this machine: a rate from another machine compares with
//! nothing here. `scripts/torch_reference.py` trains the same networks with the same recipe and
//! batches in PyTorch; the printed report names its command, to run beside this one, and
//! docs/performance.md records both side by side with their machine and date.

use crate::config::Device;
use clap::{Args, ValueEnum};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::{LayerShard, Recipe};
use fedshard_strategies::rng::{Purpose, stream, uniform};
use fedshard_training::models::char_transformer::CharShape;
use fedshard_training::models::kernels::TrainingBackend;
use fedshard_training::models::net::Architecture;
use fedshard_training::train::cohort::{self, Member};
use fedshard_training::train::neural::{
    CharWindows, CpuTraining, Examples, Rows, single_client_task,
};
use serde::Serialize;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchModel {
    /// Dense 64 → 128 → 10 on the digits, batch 32: the cross-framework reference point.
    DigitsMlp,
    /// The digits CNN, batch 32.
    DigitsCnn,
    /// 3 GPT-2 blocks, d_model 128, 4 heads, context 80, batch 10.
    CharTransformer,
    /// ResNet-18 (GroupNorm) on 3×32×32, batch 8.
    Resnet18,
    /// CCT-6/3x2 on 3×32×32, batch 8.
    Cct,
}

#[derive(Debug, Args)]
pub struct TrainBenchArgs {
    #[arg(
        long,
        value_enum,
        required_unless_present = "onnx",
        conflicts_with = "onnx"
    )]
    pub model: Option<BenchModel>,
    /// An ONNX model instead of a shipped one (docs/onnx.md), batch 32: trained on the digits
    /// when it reads 64 features into at most 10 classes, else on random rows of its input.
    #[arg(long, value_name = "FILE")]
    pub onnx: Option<std::path::PathBuf>,
    /// Clients training at once, one thread each (burn's ndarray kernels are single-threaded
    /// in this build, so threads run whole clients, as the federation runtime does).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Keep ratio of every shardable layer (1 = dense training).
    #[arg(long, default_value_t = 1.0)]
    pub keep_ratio: f64,
    /// Rows per SGD step (default: the model's own, shown in its description). The federated
    /// case is small: the main job trains batches of 8.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Seconds to measure, after one warm-up epoch.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Where to train: burn's ndarray backend, or CUDA (a build with `--features cuda` and an
    /// NVIDIA GPU; the warm-up pass includes the kernels' JIT compilation, not measured).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct TrainBenchReport {
    /// The shipped model's name, or `onnx`.
    pub model: String,
    /// The ONNX file of `--onnx`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub onnx: Option<std::path::PathBuf>,
    pub device: Device,
    /// On the CPU, the micro-kernels its matrix products ran on (`Device::products`): the
    /// figure belongs to that path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub products: Option<&'static str>,
    pub batch: usize,
    pub threads: usize,
    pub keep_ratio: f64,
    /// All threads together.
    pub samples_per_second: f64,
    /// The mean of the threads' own rates: what one client trains at under this load.
    pub samples_per_second_per_thread: f64,
    /// Each thread's fastest timed pass (a slice of up to 20 batches), as a rate; the mean over
    /// the threads. On a machine whose neighbours come and go this is the figure they disturb
    /// least; `scripts/torch_reference.py` prints the same for PyTorch.
    pub fastest_pass_samples_per_second: f64,
    /// Time of one SGD step at batch 1, in microseconds: the fixed cost of a step that no
    /// batch size amortises (autodiff graph, optimizer, allocation, kernel set-up).
    pub microseconds_per_step_at_batch_1: f64,
}

/// A benchmark model's network, example pool and default batch.
pub(crate) struct Setup {
    pub architecture: Architecture,
    pub examples: Box<dyn Examples>,
    pub batch: usize,
    /// The recipe's Frobenius decay: none for the digits-mlp reference, which
    /// scripts/torch_reference.py trains with plain SGD and momentum.
    pub weight_decay: f64,
}

/// 64 random rows of `width` features in `classes` classes.
fn random_rows(width: usize, classes: usize) -> anyhow::Result<Box<dyn Examples>> {
    let mut rng = stream(0, 0, 0, Purpose::Experiment);
    let n = 64;
    let features = (0..n * width).map(|_| uniform(&mut rng) as f32).collect();
    let labels = (0..n).map(|i| (i % classes) as u32).collect();
    Ok(Box::new(fedshard_training::data::Dataset::new(
        features, labels, width, classes,
    )?))
}

/// The set-up of `--onnx FILE`: the digits when the model reads them, else random rows.
pub(crate) fn setup_onnx(path: &std::path::Path) -> anyhow::Result<Setup> {
    let file = fedshard_training::models::onnx::OnnxFile::read(path)?;
    let (width, classes) = (file.model.input_width(), file.model.plan.classes);
    let digits = fedshard_training::data::digits::DIM;
    let examples: Box<dyn Examples> = if width == digits && classes >= 10 {
        Box::new(fedshard_training::data::digits::load()?)
    } else {
        random_rows(width, classes)?
    };
    Ok(Setup {
        architecture: Architecture::Onnx { path: file },
        examples,
        batch: 32,
        weight_decay: 1e-4,
    })
}

pub(crate) fn setup(model: BenchModel) -> anyhow::Result<Setup> {
    let digits = || -> anyhow::Result<Box<dyn Examples>> {
        Ok(Box::new(fedshard_training::data::digits::load()?))
    };
    let images = |classes: usize| random_rows(3072, classes);
    let weight_decay = if model == BenchModel::DigitsMlp {
        0.0
    } else {
        1e-4
    };
    Ok(match model {
        BenchModel::DigitsMlp => Setup {
            architecture: Architecture::digits_mlp(),
            examples: digits()?,
            batch: 32,
            weight_decay,
        },
        BenchModel::DigitsCnn => Setup {
            architecture: Architecture::DigitsCnn { classes: 10 },
            examples: digits()?,
            batch: 32,
            weight_decay,
        },
        BenchModel::CharTransformer => {
            let shape = CharShape::default();
            let mut rng = stream(0, 0, 1, Purpose::Experiment);
            let text = (0..4000)
                .map(|_| (uniform(&mut rng) * shape.vocab as f64) as u8)
                .collect();
            Setup {
                architecture: Architecture::CharTransformer(shape),
                examples: Box::new(CharWindows::all(text, shape.context)),
                batch: 10,
                weight_decay,
            }
        }
        BenchModel::Resnet18 => Setup {
            architecture: Architecture::Resnet18 { classes: 10 },
            examples: images(10)?,
            batch: 8,
            weight_decay,
        },
        BenchModel::Cct => Setup {
            architecture: Architecture::Cct { classes: 10 },
            examples: images(10)?,
            batch: 8,
            weight_decay,
        },
    })
}

pub fn train_throughput(args: &TrainBenchArgs) -> anyhow::Result<TrainBenchReport> {
    anyhow::ensure!(
        args.threads >= 1,
        "--threads: expected at least 1, found {}",
        args.threads
    );
    anyhow::ensure!(
        args.keep_ratio > 0.0 && args.keep_ratio <= 1.0,
        "--keep-ratio: expected a ratio in (0, 1], found {}",
        args.keep_ratio
    );
    let mut s = match (args.model, &args.onnx) {
        (_, Some(path)) => setup_onnx(path)?,
        (Some(model), None) => setup(model)?,
        (None, None) => unreachable!("clap requires --model or --onnx"),
    };
    if let Some(batch) = args.batch {
        anyhow::ensure!(batch >= 1, "--batch: expected at least 1, found {batch}");
        s.batch = batch;
    }
    let (state, shardable) = s
        .architecture
        .initial_state(0)
        .map_err(anyhow::Error::msg)?;
    let task =
        single_client_task(&state, &shardable, args.keep_ratio, 0).map_err(anyhow::Error::msg)?;
    let batch = s.batch;
    let (rates, steps_per_second) = match args.device {
        Device::Cpu => rates_on::<CpuTraining>(&mut s, &task, args, &Default::default())?,
        Device::Cuda => cuda::rates(&mut s, &task, args)?,
    };
    let total: f64 = rates.iter().map(|r| r.mean).sum();
    let fastest: f64 = rates.iter().map(|r| r.fastest).sum();
    let model = args.model.and_then(|m| m.to_possible_value());
    Ok(TrainBenchReport {
        model: model.map_or("onnx".into(), |m| m.get_name().to_string()),
        onnx: args.onnx.clone(),
        device: args.device,
        products: args.device.products(),
        batch,
        threads: args.threads,
        keep_ratio: args.keep_ratio,
        samples_per_second: total,
        samples_per_second_per_thread: total / rates.len() as f64,
        fastest_pass_samples_per_second: fastest / rates.len() as f64,
        microseconds_per_step_at_batch_1: 1e6 / steps_per_second.mean,
    })
}

/// Each thread's rate at the set-up's batch, then the steps per second at batch 1 (alone on
/// one thread, for a fifth of the time): the fixed cost of a step.
fn rates_on<B: TrainingBackend>(
    s: &mut Setup,
    task: &(ModelState, Vec<LayerShard>),
    args: &TrainBenchArgs,
    device: &B::Device,
) -> anyhow::Result<(Vec<Rate>, Rate)> {
    let setup: &Setup = s;
    let rates = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.threads)
            .map(|_| scope.spawn(|| client_rate::<B>(setup, task, args.seconds, device)))
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .map_err(|_| anyhow::anyhow!("a benchmark thread panicked"))?
            })
            .collect::<anyhow::Result<Vec<Rate>>>()
    })?;
    s.batch = 1;
    let seconds = (args.seconds / 5.0).max(0.5);
    let steps_per_second = client_rate::<B>(s, task, seconds, device)?;
    Ok((rates, steps_per_second))
}

/// The same measurement on burn's CUDA backend, compiled only with the `cuda` feature.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use burn::backend::{Autodiff, Cuda};

    pub fn rates(
        s: &mut Setup,
        task: &(ModelState, Vec<LayerShard>),
        args: &TrainBenchArgs,
    ) -> anyhow::Result<(Vec<Rate>, Rate)> {
        let device = crate::federation::cuda_device()?;
        rates_on::<Autodiff<Cuda>>(s, task, args, &device)
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::*;

    pub fn rates(
        _: &mut Setup,
        _: &(ModelState, Vec<LayerShard>),
        _: &TrainBenchArgs,
    ) -> anyhow::Result<(Vec<Rate>, Rate)> {
        anyhow::bail!(
            "--device cuda: this fedshard was built without CUDA (rebuild with `cargo build --release --features cuda`)"
        )
    }
}

/// A training rate in samples per second: over the whole measurement, and of its fastest pass.
#[derive(Debug, Clone, Copy)]
struct Rate {
    mean: f64,
    fastest: f64,
}

/// One client's training rate: its own copy of the task's model, trained on slices of the data
/// until `seconds` have been measured after a warm-up pass.
fn client_rate<B: TrainingBackend>(
    s: &Setup,
    (dense, shards): &(ModelState, Vec<LayerShard>),
    seconds: f64,
    device: &B::Device,
) -> anyhow::Result<Rate> {
    let recipe = Recipe {
        learning_rate: 0.01,
        epochs: 1,
        batch_size: s.batch,
        momentum: 0.9,
        weight_decay: s.weight_decay,
        clip_lr: (!shards.is_empty()).then_some(10.0),
        proximal_mu: 0.0,
    };
    // One pass over a slice of the data per call; the first call is the warm-up. Each call
    // starts from the tensors the last one trained, as a client's next round would.
    let per_call = s.examples.len().min(s.batch * 20);
    let slice = Rows {
        examples: s.examples.as_ref(),
        rows: (0..per_call).collect(),
    };
    let (mut dense, mut shards) = (dense.clone(), shards.clone());
    let mut samples = 0usize;
    let mut elapsed = 0.0;
    let mut shortest = f64::INFINITY;
    let mut round = 0;
    while elapsed < seconds || round < 2 {
        let started = Instant::now();
        let member = Member {
            dense: &dense,
            shards: &shards,
            width: None,
            examples: &slice,
            seed: 0,
            round,
            client: 0,
            variates: None,
        };
        let trained = cohort::train::<B, _>(&s.architecture, &recipe, &[member], device)
            .pop()
            .expect("one result per member")
            .map_err(anyhow::Error::msg)?;
        (dense, shards) = (trained.dense, trained.shards);
        if round > 0 {
            let pass = started.elapsed().as_secs_f64();
            elapsed += pass;
            shortest = shortest.min(pass);
            samples += per_call;
        }
        round += 1;
    }
    Ok(Rate {
        mean: samples as f64 / elapsed,
        fastest: per_call as f64 / shortest,
    })
}

/// The human-readable line of a report.
pub fn describe(r: &TrainBenchReport) -> String {
    let model = match &r.onnx {
        Some(path) => format!("onnx {}", path.display()),
        None => r.model.clone(),
    };
    let mut line = format!(
        // One decimal, as the PyTorch script prints it: at 20–60 samples/s a whole number
        // hides up to 2.5% of a ratio.
        "train {model} on {}: batch {}, {} thread(s), keep ratio {}: {:.1} samples/s \
         (fastest pass {:.1})",
        r.device.label(),
        r.batch,
        r.threads,
        r.keep_ratio,
        r.samples_per_second,
        r.fastest_pass_samples_per_second
    );
    if r.threads > 1 {
        line += &format!(" in all, {:.1} per thread", r.samples_per_second_per_thread);
    }
    line += &format!(
        "; one step at batch 1: {:.0} µs",
        r.microseconds_per_step_at_batch_1
    );
    if r.keep_ratio == 1.0 && r.onnx.is_none() {
        line += &format!("\n{}", torch_beside(r));
    }
    line
}

/// The command that measures PyTorch on this machine with the same network, recipe and batch
/// (dense: the script has no shards), to compare with the per-thread rate above.
fn torch_beside(r: &TrainBenchReport) -> String {
    let device = match r.device {
        Device::Cpu => "",
        Device::Cuda => " --device cuda",
    };
    format!(
        "PyTorch beside it (one thread, same network, recipe and batch; PyTorch in a venv, see \
         the script's header): python3 scripts/torch_reference.py --runs {}:{}{device}",
        r.model, r.batch
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build without the `cuda` feature refuses `--device cuda` naming the flag and the
    /// rebuild, rather than measuring the CPU under the GPU's name.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_clear_error() {
        let args = TrainBenchArgs {
            model: Some(BenchModel::DigitsMlp),
            onnx: None,
            threads: 1,
            keep_ratio: 1.0,
            batch: Some(4),
            seconds: 0.01,
            device: Device::Cuda,
            json: false,
        };
        let error = train_throughput(&args)
            .expect_err("no CUDA in this build")
            .to_string();
        assert!(error.contains("--device cuda"), "{error}");
        assert!(error.contains("--features cuda"), "{error}");
    }

    fn report(keep_ratio: f64, device: Device) -> TrainBenchReport {
        TrainBenchReport {
            model: "digits-cnn".into(),
            onnx: None,
            device,
            products: device.products(),
            batch: 8,
            threads: 1,
            keep_ratio,
            samples_per_second: 9_700.0,
            samples_per_second_per_thread: 9_700.0,
            fastest_pass_samples_per_second: 9_900.0,
            microseconds_per_step_at_batch_1: 280.0,
        }
    }

    /// The printed lines carry this machine's measurement and no figure from elsewhere: the
    /// PyTorch side is a command to run here, with the same model, batch and device.
    #[test]
    fn the_report_names_the_pytorch_command_instead_of_a_stored_figure() {
        let cpu = describe(&report(1.0, Device::Cpu));
        assert!(
            cpu.contains("9700.0 samples/s (fastest pass 9900.0)"),
            "{cpu}"
        );
        assert!(
            cpu.ends_with("python3 scripts/torch_reference.py --runs digits-cnn:8"),
            "{cpu}"
        );
        assert!(
            !cpu.contains('×'),
            "no ratio against a stored figure: {cpu}"
        );
        let cuda = describe(&report(1.0, Device::Cuda));
        assert!(
            cuda.ends_with("--runs digits-cnn:8 --device cuda"),
            "{cuda}"
        );
        // The script trains the dense model only: a sharded rate has no PyTorch counterpart.
        let sharded = describe(&report(0.5, Device::Cpu));
        assert!(!sharded.contains("torch_reference"), "{sharded}");
    }
}
