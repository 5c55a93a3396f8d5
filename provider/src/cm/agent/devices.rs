//! The devices and addresses the CM can use, as the subsystem reports
//! them: its client takes each soft device's QP1 as it comes and lets it
//! go as it leaves, and its CM hook tells ids of a device's removal and
//! of an address that left their device.

use std::net::IpAddr;
use std::sync::{Arc, Weak};

use crate::cm::CmEventKind;
use crate::soft::engine::EngineMode;
use crate::subsystem::{AddressChange, Client, CmHook, DeviceRef, Generation, NamespaceId, NetnsMode, RemovalReason};

use super::state::*;
use super::*;

pub(super) struct CmClient(pub(super) Weak<Inner>);

impl Client for CmClient {
    fn add(&self, d: &DeviceRef) -> crate::verbs::Result<()> {
        if let Some(inner) = self.0.upgrade() {
            inner.add_device(d);
        }
        Ok(())
    }

    fn remove(&self, d: &DeviceRef, _why: RemovalReason) {
        if let Some(inner) = self.0.upgrade() {
            inner.remove_device(d);
        }
    }
}

pub(super) struct Hook(pub(super) Weak<Inner>);

impl CmHook for Hook {
    fn device_removal(&self, d: &DeviceRef, _why: RemovalReason) {
        if let Some(inner) = self.0.upgrade() {
            inner.device_removal(d.name(), d.generation());
        }
    }

    fn address_change(&self, d: &DeviceRef, addr: IpAddr, change: AddressChange) {
        if let Some(inner) = self.0.upgrade() {
            inner.address_change(d, addr, change);
        }
    }
}

impl Inner {
    fn add_device(self: &Arc<Self>, d: &DeviceRef) {
        let Some(soft) = d.soft_device() else {
            // A hardware device: the kernel's rdma_cm owns its QP1; ids on
            // it run on librdmacm.
            #[cfg(feature = "hardware")]
            self.lock().hw_devices.insert(d.name().to_string(), d.clone());
            return;
        };
        let shared = soft.shared().clone();
        let sink = Arc::new(Sink {
            inner: Arc::downgrade(self),
            dev: d.name().to_string(),
            gen: d.generation(),
        });
        if !shared.set_gsi_sink(Some(sink)) {
            // Another CM owns this device's QP1.
            return;
        }
        let withdrawn = d.withdrawn_addrs();
        let dev = Dev {
            dref: d.clone(),
            addrs: shared
                .addrs()
                .iter()
                .filter(|a| !withdrawn.contains(a))
                .copied()
                .collect(),
            guid: soft.attr().node_guid.0,
            mtu: soft.port_attr().active_mtu,
            drive: matches!(shared.mode(), EngineMode::Inline) && !shared.poll_fds().is_empty(),
            shared,
        };
        self.lock().devices.insert(d.name().to_string(), dev);
        self.wake();
    }

    fn remove_device(&self, d: &DeviceRef) {
        let gone = {
            let mut st = self.lock();
            #[cfg(feature = "hardware")]
            if st.hw_devices.get(d.name()).is_some_and(|x| x.same_instance(d)) {
                st.hw_devices.remove(d.name());
            }
            match st.devices.get(d.name()) {
                Some(x) if x.dref.same_instance(d) => st.devices.remove(d.name()),
                _ => None,
            }
        };
        if let Some(dev) = gone {
            dev.shared.set_gsi_sink(None);
        }
    }

    /// The subsystem's CM hook: every id on the device gets DEVICE_REMOVAL
    /// once; its timers stop; nothing more is sent for it.
    pub(crate) fn device_removal(&self, name: &str, gen: Generation) {
        let mut st = self.lock();
        let keys: Vec<u64> = st
            .ids
            .iter()
            .filter(|(_, id)| id.dev.as_ref().is_some_and(|(n, g)| n == name && *g == gen))
            .map(|(k, _)| *k)
            .collect();
        let mut contexts = Vec::new();
        for key in keys {
            Self::remove_one(&mut st, key);
            // The id's own handle on the device's context goes now, so the
            // removal waits only for what the application holds.
            contexts.extend(st.ids.get_mut(&key).and_then(|id| id.ctx.take()));
        }
        drop(st);
        drop(contexts);
    }

    /// The subsystem's CM hook for addresses: `addr` left device `d` (or
    /// came to it, leaving any other device of its namespace that had it).
    /// The CM's address table follows, so later binds and resolutions see
    /// the change, and every id bound through `addr` on a device that lost
    /// it gets one ADDR_CHANGE. A report that changes nothing (the address
    /// was already gone) delivers nothing.
    pub(crate) fn address_change(&self, d: &DeviceRef, addr: IpAddr, change: AddressChange) {
        let shared_mode = self.sub.mode() == NetnsMode::Shared;
        let mut st = self.lock();
        let mut lost: Vec<(String, Generation)> = Vec::new();
        for (name, dev) in st.devices.iter_mut() {
            let this = dev.dref.same_instance(d);
            let affected = match change {
                AddressChange::Removed => this,
                AddressChange::Added => !this && (shared_mode || dev.dref.namespace() == d.namespace()),
            };
            if affected && dev.addrs.contains(&addr) {
                dev.addrs.retain(|a| *a != addr);
                lost.push((name.clone(), dev.dref.generation()));
            }
        }
        if change == AddressChange::Added {
            // Usable here only through a GID the device has: a soft
            // device's GID table is fixed for its life.
            if let Some(dev) = st.devices.get_mut(d.name()).filter(|x| x.dref.same_instance(d)) {
                if !dev.addrs.contains(&addr) && dev.sgid_index(addr).is_some() {
                    dev.addrs.push(addr);
                }
            }
        }
        if lost.is_empty() {
            return;
        }
        let mut keys: Vec<u64> = st
            .ids
            .iter()
            .filter(|(_, id)| {
                !id.removed
                    && !id.destroyed
                    && id.src.is_some_and(|s| s.ip() == addr)
                    && id.dev.as_ref().is_some_and(|d| lost.contains(d))
            })
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        for k in keys {
            st.post_kind(k, CmEventKind::AddrChange);
        }
    }
}

/// Which device has or reaches an address.
impl State {
    /// The device of namespace `ns` that has `ip`.
    pub(crate) fn device_with(&self, ns: NamespaceId, ip: IpAddr, shared_mode: bool) -> Option<(String, Generation)> {
        let mut v: Vec<_> = self
            .devices
            .values()
            .filter(|d| (d.dref.namespace() == ns || shared_mode) && d.addrs.contains(&ip))
            .map(|d| (d.dref.name().to_string(), d.dref.generation()))
            .collect();
        v.sort();
        v.into_iter().next()
    }

    /// The device to reach `dst` from namespace `ns`, and its source address.
    pub(crate) fn pick_device(
        &self,
        ns: NamespaceId,
        dst: IpAddr,
        shared_mode: bool,
    ) -> Option<(String, Generation, IpAddr)> {
        if let Some((n, g)) = self.device_with(ns, dst, shared_mode) {
            return Some((n, g, dst));
        }
        let mut v: Vec<_> = self
            .devices
            .values()
            .filter(|d| d.dref.namespace() == ns || shared_mode)
            .filter_map(|d| {
                let ip = d.addrs.iter().find(|a| a.is_ipv4() == dst.is_ipv4())?;
                Some((d.dref.name().to_string(), d.dref.generation(), *ip))
            })
            .collect();
        v.sort();
        v.into_iter().next()
    }
}
