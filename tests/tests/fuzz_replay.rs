//! Every fuzz target as an ordinary test: its committed corpus
//! (`fuzz/corpus/<target>/`) and a fixed number of seeded random inputs.

use cxlkv_core::hash::mix64;
use cxlkv_tests::capi::{capi_pooled, capi_target, CapiRun};
use cxlkv_tests::fuzz::{attach_target, ops_target};

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus in {dir:?}");
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn random_input(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = mix64(x + 1);
            x as u8
        })
        .collect()
}

#[test]
fn attach_target_replays_corpus_and_seeded_inputs() {
    for input in corpus("attach") {
        attach_target(&input);
    }
    for seed in 0..150u64 {
        let mut input = random_input(seed, 1 + (seed as usize * 37) % 600);
        if seed % 3 == 0 {
            input[0] |= 1; // a region of raw random bytes
        }
        attach_target(&input);
    }
}

#[test]
fn ops_target_replays_corpus_and_seeded_inputs() {
    let mut published = 0;
    for input in corpus("ops") {
        published += ops_target(&input);
    }
    for seed in 0..25u64 {
        published += ops_target(&random_input(seed ^ 0x0b5, 60 + (seed as usize * 13) % 300));
    }
    assert!(published > 50, "the scripts should publish blocks: {published}");
}

/// Runs `target` over the capi corpus and `n` seeded random inputs; checks
/// the scripts made calls and published blocks.
fn replay_capi(target: fn(&[u8]) -> CapiRun, n: u64, salt: u64) {
    let (mut calls, mut published) = (0, 0);
    let seeded = (0..n).map(|seed| random_input(seed ^ salt, 40 + (seed as usize * 29) % 400));
    for input in corpus("capi").into_iter().chain(seeded) {
        let run = target(&input);
        calls += run.calls;
        published += run.published;
    }
    assert!(calls > 1000, "the scripts should make calls: {calls}");
    assert!(published > 20, "the scripts should publish blocks: {published}");
}

#[test]
fn capi_target_replays_corpus_and_seeded_inputs() {
    replay_capi(capi_target, 20, 0xc0de);
}

#[test]
fn capi_pooled_mode_keeps_its_region_clean_across_inputs() {
    // The pooled mode's inputs share one region and its nodes: each must
    // leave it empty and clean for the next (each ends with a check that
    // panics otherwise), including inputs that detach pooled nodes.
    replay_capi(capi_pooled, 40, 0x9001);
}
