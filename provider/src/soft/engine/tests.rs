//! The engine's entry points for a thread that drives a device from
//! outside.

use crate::soft::{SoftDevice, SoftDeviceConfig};

fn device(name: &str) -> std::sync::Arc<SoftDevice> {
    SoftDevice::create(SoftDeviceConfig::new(name, "127.83.203.1".parse().unwrap())).unwrap()
}

#[test]
fn an_outside_driver_never_waits_for_a_verb_holding_the_engine() {
    let dev = device("engine_try_drive");
    let shared = dev.shared().clone();
    let held = shared.lock();
    // A verb holds the engine: each returns at once, with nothing done.
    assert_eq!(shared.try_drive(), None);
    assert_eq!(shared.poll_link(), None);
    assert_eq!(shared.until_deadline(), None);
    drop(held);
    assert_eq!(shared.try_drive(), Some(0));
    assert_eq!(shared.poll_link(), Some(0));
    dev.remove();
}
