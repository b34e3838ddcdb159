use std::process::ExitCode;

/// Training allocates and frees tensor buffers of a few hundred KB at every operation; with
/// glibc's allocator the kernel kept faulting in and zeroing their pages (4–5% of a char
/// transformer step), mimalloc reuses them: 75 → 91 samples/s (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (index 15 of `mi_option_e` in both its v2 and v3
/// headers; the Rust bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Training frees and re-allocates activation buffers of a few MB at every step, and where
/// they land in mimalloc's arenas drifts. With mimalloc's default purge delay (1 s) the
/// slices left idle were returned to the OS and faulted back in (as zeroed 2 MB huge pages)
/// when the drift reached them again: 4–6% of a char-transformer run was the kernel zeroing
/// pages (`clear_page_erms`, system time 0.13–0.21 s of 3.3 s). Held for 10 s, they are reused
/// (system time 0.01 s), and an idle process still gives its memory back.
fn keep_freed_pages_for_ten_seconds() {
    // SAFETY: sets one integer option of the allocator; mimalloc reads options atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) };
}

/// The build targets x86-64-v3 (`.cargo/config.toml`): a CPU without AVX2 and FMA is told so
/// instead of dying of an illegal instruction somewhere in a kernel.
fn check_cpu() -> Result<(), String> {
    #[cfg(target_arch = "x86_64")]
    if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"))
    {
        return Err(
            "this fedshard was built for x86-64-v3 CPUs (AVX2 and FMA, 2013 on) and \
                    this CPU lacks them; rebuild for a baseline x86-64 with \
                    RUSTFLAGS=\"-C target-cpu=x86-64\" cargo build --release"
                .into(),
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    if let Err(err) = check_cpu() {
        eprintln!("error: {err}");
        return ExitCode::from(2);
    }
    keep_freed_pages_for_ten_seconds();
    let cli = fedshard::cli::first_run::parse();
    match fedshard::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
