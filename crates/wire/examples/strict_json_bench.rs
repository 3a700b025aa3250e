//! What refusing duplicate member names costs: `strict::from_slice` against
//! `serde_json::from_slice::<Value>` on a realistic `tools/call` frame, in the same process.
//!
//! ```text
//! cargo run --release -p palisade-wire --example strict_json_bench [-- PARSES_PER_PARSER]
//! ```
//!
//! Each parser parses the frame `PARSES_PER_PARSER` times (default 1,000,000) in 100 short rounds
//! that alternate which parser goes first (so that a busy machine slows both alike), after a
//! warm-up. The report: each parser's median nanoseconds per parse over the rounds, the ratio of
//! the medians (strict / serde_json), and the median of the per-round ratios. The system allocator
//! serves both parsers alike; the palisade binary ships with mimalloc.

use std::hint::black_box;
use std::time::Instant;

use palisade_wire::strict;
use serde_json::Value;

/// A 2026-07-28 `tools/call` as a client sends it (about 300 bytes).
const FRAME: &[u8] = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"product_get","#,
    r#""arguments":{"sku":"TEA-001","quantity":2,"note":"gift wrap"},"#,
    r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","#,
    r#""io.modelcontextprotocol/clientCapabilities":{},"#,
    r#""io.modelcontextprotocol/clientInfo":{"name":"bench-client","version":"1.4.2"}}}}"#
)
.as_bytes();

const ROUNDS: usize = 100;

/// Nanoseconds per parse of `parses` parses by `parse`.
fn round(parses: usize, parse: fn(&[u8]) -> bool) -> f64 {
    let started = Instant::now();
    for _ in 0..parses {
        assert!(parse(black_box(FRAME)));
    }
    started.elapsed().as_nanos() as f64 / parses as f64
}

fn plain(bytes: &[u8]) -> bool {
    black_box(serde_json::from_slice::<Value>(bytes)).is_ok()
}

fn strict_parse(bytes: &[u8]) -> bool {
    black_box(strict::from_slice(bytes)).is_ok()
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let middle = samples.len() / 2;
    if samples.len().is_multiple_of(2) { (samples[middle - 1] + samples[middle]) / 2.0 } else { samples[middle] }
}

fn main() {
    let total: usize = match std::env::args().nth(1).map(|arg| arg.parse()) {
        None => 1_000_000,
        Some(Ok(total)) if total >= ROUNDS => total,
        Some(_) => {
            eprintln!("usage: strict_json_bench [PARSES_PER_PARSER (at least {ROUNDS})]");
            std::process::exit(2);
        }
    };
    let same = serde_json::from_slice::<Value>(FRAME).ok() == strict::from_slice(FRAME).ok();
    assert!(same, "the two parsers disagree on the benchmark frame");
    let per_round = total / ROUNDS;
    round(per_round / 4, plain);
    round(per_round / 4, strict_parse);
    let (mut plain_ns, mut strict_ns) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for index in 0..ROUNDS {
        if index.is_multiple_of(2) {
            plain_ns.push(round(per_round, plain));
            strict_ns.push(round(per_round, strict_parse));
        } else {
            strict_ns.push(round(per_round, strict_parse));
            plain_ns.push(round(per_round, plain));
        }
    }
    let mut ratios: Vec<f64> = strict_ns.iter().zip(&plain_ns).map(|(strict, plain)| strict / plain).collect();
    let (plain_median, strict_median) = (median(&mut plain_ns), median(&mut strict_ns));
    #[allow(clippy::print_stdout)]
    {
        println!(
            "frame: {} bytes; {} parses per parser in {ROUNDS} interleaved rounds",
            FRAME.len(),
            per_round * ROUNDS
        );
        println!("serde_json::from_slice::<Value>: median {plain_median:.1} ns/parse");
        println!("strict::from_slice:              median {strict_median:.1} ns/parse");
        println!("ratio of the medians:            {:.3}", strict_median / plain_median);
        println!("median of the per-round ratios:  {:.3}", median(&mut ratios));
    }
}
