//! Time and bytes per client per round of one secure-aggregation session, for docs/secagg.md.
//!
//! `cargo run --release -p fedshard-secagg --example secagg_cost -- [clients] [length] [dropout%]`
//! (defaults: 100 clients, 100 000 values, 10% dropping before their masked input). Runs SecAgg
//! (complete graph) and SecAgg+ (random regular graph of degree 2⌈log2 n⌉) with
//! `t = ⌊n/2⌋ + 1` holders (SecAgg+: of each neighbourhood), 32-bit values, all in one thread.

use std::time::Duration;

use fedshard_secagg::{Dropouts, Graph, Params, Round, SessionId, simulate};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: usize| args.get(i).map_or(Ok(default), |a| a.parse());
    let n = arg(0, 100)?;
    let len = arg(1, 100_000)?;
    let dropout_percent = arg(2, 10)?;
    let log_n = usize::BITS - n.saturating_sub(1).leading_zeros();
    let degree = 2 * log_n as usize;
    let graphs = [
        ("SecAgg (complete)", Graph::Complete, n / 2 + 1),
        (
            "SecAgg+ (random regular)",
            Graph::RandomRegular { degree, seed: 7 },
            (degree + 1).min(n) / 2 + 1,
        ),
    ];
    let clients: Vec<u32> = (0..n as u32).collect();
    let dropped = n * dropout_percent / 100;
    println!(
        "n = {n} clients, {len} values of 32 bits, {dropped} dropping before round 2; \
         ms and bytes per client (sender) per round, server ms per round"
    );
    for (name, graph, threshold) in graphs {
        let params = Params {
            session: SessionId([1; 16]),
            clients: clients.clone(),
            threshold,
            graph,
            bits: 32,
            vector_len: len,
        };
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let inputs: Vec<Vec<u64>> = clients
            .iter()
            .map(|_| (0..len).map(|_| u64::from(rng.next_u32())).collect())
            .collect();
        // Spread the dropouts over the ids: SecAgg+ neighbourhoods are random anyway.
        let dropouts =
            Dropouts::at_masked_input((0..dropped).map(|i| (i * n / dropped.max(1)) as u32));
        let run = simulate(&params, &inputs, &dropouts, &mut rng)?;
        println!(
            "\n{name}: t = {threshold}, {} survivors",
            run.aggregate.survivors.len()
        );
        println!(
            "{:<16} {:>10} {:>12} {:>14} {:>10}",
            "round", "client ms", "upload B", "download B", "server ms"
        );
        for (round, cost) in Round::ALL.iter().zip(&run.rounds) {
            let per = |x: f64| x / cost.senders.max(1) as f64;
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!(
                "{:<16} {:>10.2} {:>12.0} {:>14.0} {:>10.1}",
                format!("{round:?}"),
                per(ms(cost.client_time)),
                per(cost.upload_bytes as f64),
                per(cost.download_bytes as f64),
                ms(cost.server_time),
            );
        }
    }
    Ok(())
}
