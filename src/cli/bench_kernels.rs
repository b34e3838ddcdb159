//! `fedshard bench kernels`: timings of the CUDA kernels a training step waits for (a build
//! with `--features cuda` and an NVIDIA GPU): each convolution pass against burn's own kernel,
//! and the cohorts' batched products per matrix-product strategy, one line per problem as it
//! is measured. docs/performance.md ("On a GPU") records what it printed and on which card.

use clap::Args;

#[derive(Debug, Args)]
pub struct KernelBenchArgs {}

/// Prints each timing as it is measured.
pub fn kernels(_: &KernelBenchArgs) -> anyhow::Result<()> {
    cuda::kernels()
}

#[cfg(feature = "cuda")]
mod cuda {
    use fedshard_training::models::kernels::cuda::timings;

    pub fn kernels() -> anyhow::Result<()> {
        crate::federation::cuda_device()?;
        println!("convolution passes, burn's kernel → fedshard's (µs per call):");
        timings::convolution_passes(&mut |line| println!("  {line}"));
        println!("cohort products, per strategy (µs per call, TFLOP/s):");
        timings::cohort_products(&mut |line| println!("  {line}"));
        Ok(())
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    pub fn kernels() -> anyhow::Result<()> {
        anyhow::bail!(
            "bench kernels times CUDA kernels: this fedshard was built without CUDA (rebuild with `cargo build --release --features cuda`)"
        )
    }
}
