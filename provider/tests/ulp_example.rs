//! The worked example of the ULP layer (a block-storage-like target and
//! initiator) runs, every read checked against a model of the store.

#[path = "../examples/ulp_blockstore.rs"]
mod example;

#[test]
fn block_store_over_the_layer_moves_checked_data() {
    let (n, bytes, _) = example::run(&softverbs::soft::embedded_default().unwrap(), 200, None).unwrap();
    assert_eq!(n, 200);
    assert!(bytes >= 200 * 4096);
}

#[path = "../examples/ulp_blockstore_raw.rs"]
mod raw;

#[test]
fn the_same_over_raw_verbs_moves_checked_data() {
    let (n, bytes, _) = raw::run(&softverbs::soft::embedded_default().unwrap(), 200, None).unwrap();
    assert_eq!(n, 200);
    assert!(bytes >= 200 * 4096);
}

/// Both over the shared-memory link, at a fixed size (what the benchmark
/// figures in `benches/RESULTS.md` run).
#[test]
fn both_run_over_the_shm_link_at_a_fixed_size() {
    let devs = match example::shm_pair() {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP: no shared-memory link here: {e}");
            return;
        }
    };
    let (n, bytes, _) = example::run(&devs, 50, Some(64 << 10)).unwrap();
    assert_eq!((n, bytes), (50, 50 * (64 << 10)));
    drop(devs);
    let devs = raw::shm_pair().unwrap();
    let (n, bytes, _) = raw::run(&devs, 50, Some(64 << 10)).unwrap();
    assert_eq!((n, bytes), (50, 50 * (64 << 10)));
}
