//! `make bench` (data): rows per second read (JSON Lines, gzipped JSON Lines, Parquet) and
//! tokenised (one thread, then every core), on 100k generated preference rows and the test
//! fixtures' byte-level BPE tokenizer.
//!
//! Timings are printed, never asserted. The allocator is the binary's (mimalloc), so the rates are
//! what `dpo-train` gets.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use dpo_train::data::{LoadOptions, Tokenizer, load_preferences, tokenize};
use parquet::arrow::ArrowWriter;

const ROWS: usize = 100_000;

fn row(i: usize) -> (String, String, String) {
    let prompt = format!("Question {i}: what is {} plus {}? Explain the steps briefly.", i % 97, i % 89);
    let chosen = format!(" The answer is {}. Add the ones, then the tens.", i % 97 + i % 89);
    let rejected = format!(" The answer is {}, I think, but I am not sure at all.", i % 97 + i % 89 + 1);
    (prompt, chosen, rejected)
}

fn write_inputs(dir: &Path) {
    let rows: Vec<_> = (0..ROWS).map(row).collect();
    let mut jsonl = String::new();
    for (p, c, r) in &rows {
        jsonl.push_str(&serde_json::json!({"prompt": p, "chosen": c, "rejected": r}).to_string());
        jsonl.push('\n');
    }
    std::fs::write(dir.join("rows.jsonl"), &jsonl).expect("rows.jsonl");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(jsonl.as_bytes()).expect("gzip");
    std::fs::write(dir.join("rows.jsonl.gz"), gz.finish().expect("gzip")).expect("rows.jsonl.gz");
    let column = |f: fn(&(String, String, String)) -> &String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
    };
    let batch = RecordBatch::try_from_iter([
        ("prompt", column(|r| &r.0)),
        ("chosen", column(|r| &r.1)),
        ("rejected", column(|r| &r.2)),
    ])
    .expect("a record batch");
    let file = std::fs::File::create(dir.join("rows.parquet")).expect("rows.parquet");
    let mut writer = ArrowWriter::try_new(file, batch.schema(), None).expect("a Parquet writer");
    writer.write(&batch).expect("Parquet rows");
    writer.close().expect("Parquet footer");
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    write_inputs(dir.path());
    let tokenizer = Tokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer"))
        .expect("the fixture tokenizer");
    println!("data: {ROWS} preference rows");
    let mut rows = Vec::new();
    for name in ["rows.jsonl", "rows.jsonl.gz", "rows.parquet"] {
        let started = Instant::now();
        rows = load_preferences(&dir.path().join(name), &LoadOptions::default()).expect("the rows").rows;
        let secs = started.elapsed().as_secs_f64();
        println!("  read {name:<14} {:>10.0} rows/s", rows.len() as f64 / secs);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    for threads in [1, cores] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
        let started = Instant::now();
        let (pairs, _) = pool.install(|| tokenize(&rows, &tokenizer, Some(1024))).expect("tokenised rows");
        let secs = started.elapsed().as_secs_f64();
        println!("  tokenise, {threads} thread(s) {:>8.0} rows/s", pairs.len() as f64 / secs);
    }
}
