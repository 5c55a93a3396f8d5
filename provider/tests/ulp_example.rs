//! The worked example of the ULP layer (a block-storage-like target and
//! initiator) runs, every read checked against a model of the store.

#[path = "../examples/ulp_blockstore.rs"]
mod example;

#[test]
fn block_store_over_the_layer_moves_checked_data() {
    let (n, bytes, _) = example::run(200).unwrap();
    assert_eq!(n, 200);
    assert!(bytes >= 200 * 4096);
}

#[path = "../examples/ulp_blockstore_raw.rs"]
mod raw;

#[test]
fn the_same_over_raw_verbs_moves_checked_data() {
    let (n, bytes, _) = raw::run(200).unwrap();
    assert_eq!(n, 200);
    assert!(bytes >= 200 * 4096);
}
