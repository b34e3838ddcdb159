//! The CUDA backend of the trainers and the evaluator, compiled only with the `cuda` feature
//! (`no_cuda.rs` stands in without it).

use super::trainers::{EVAL_BATCH, Gatherer};
use burn::backend::{Autodiff, Cuda, cuda::CudaDevice};
use fedshard_protocol::task::{Evaluator, LocalTrainer};
use fedshard_training::models::net::Architecture;
use fedshard_training::train::gather::{Cohorts, Gathering, InCohorts};
use fedshard_training::train::neural::{Examples, LocalMethod, NeuralClient, NeuralEvaluator};
use fedshard_training::train::slots::OnACore;
use std::sync::Arc;

/// Fails with a clear message when no GPU, driver or CUDA toolkit is present. burn panics on
/// first use, often in its device thread, so the probe runs under `catch_unwind` with a panic
/// hook that collects instead of printing (no backtrace on the terminal), and the first
/// panic's text, which names what is missing (the driver, `libnvrtc`, `CUDA_PATH`), goes
/// into the error.
pub fn device() -> anyhow::Result<CudaDevice> {
    let device = CudaDevice::default();
    let first_panic = Arc::new(std::sync::OnceLock::<String>::new());
    let hook = std::panic::take_hook();
    let sink = Arc::clone(&first_panic);
    std::panic::set_hook(Box::new(move |info| {
        let _ = sink.set(info.payload_as_str().unwrap_or("a panic").to_owned());
    }));
    let probe = std::panic::catch_unwind(|| {
        burn::tensor::Tensor::<Cuda, 1>::zeros([1], &device).into_data()
    });
    std::panic::set_hook(hook);
    if probe.is_ok() {
        return Ok(device);
    }
    let cause = first_panic.get().map_or("", String::as_str);
    anyhow::bail!(
        "field `training.device` (or `--device`): CUDA was selected, but no usable NVIDIA GPU, driver or CUDA toolkit was found (the toolkit's `libnvrtc` on the library path, its headers under `CUDA_PATH` or /usr/local/cuda); use `cpu`. Cause: {}",
        cause.trim()
    )
}

/// The cohort queue of the process's CUDA clients.
pub type Queue = Arc<Cohorts<Autodiff<Cuda>>>;

pub fn queue(gathering: Gathering) -> anyhow::Result<Queue> {
    Ok(Cohorts::new(gathering))
}

pub fn trainer(
    net: &Architecture,
    examples: Box<dyn Examples>,
    method: LocalMethod,
    gatherer: &Gatherer,
) -> anyhow::Result<Arc<dyn LocalTrainer>> {
    let client = Arc::new(NeuralClient::<Autodiff<Cuda>> {
        architecture: net.clone(),
        examples,
        device: device()?,
        method,
    });
    Ok(match gatherer {
        Gatherer::Cuda(cohorts) => Arc::new(InCohorts {
            client,
            cohorts: Arc::clone(cohorts),
        }),
        _ => Arc::new(OnACore(client)),
    })
}

pub fn evaluator(
    net: &Architecture,
    examples: Box<dyn Examples>,
) -> anyhow::Result<Arc<dyn Evaluator>> {
    Ok(Arc::new(NeuralEvaluator::<Cuda> {
        architecture: net.clone(),
        examples,
        device: device()?,
        batch_size: EVAL_BATCH,
    }))
}
