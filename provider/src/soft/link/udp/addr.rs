//! GIDs of UDP devices and the (IP address, UDP port) they stand for.
//!
//! See the [module docs](super) for the scheme; this file is its one
//! implementation: [`gid_of`] (what GID a device bound to an endpoint has),
//! [`endpoint_of`] (where packets to a GID go) and [`source_gid`] (which GID
//! a received datagram came from).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::soft::wire::ROCEV2_UDP_PORT;
use crate::verbs::Gid;

/// The first six bytes of every private GID: `fd73:7665:7262`, a unique
/// local address (RFC 4193, `fd00::/8`) whose 40-bit global ID is the
/// ASCII of "sverb".
pub const PRIVATE_PREFIX: [u8; 6] = [0xfd, 0x73, 0x76, 0x65, 0x72, 0x62];

/// Subnet ID (bytes 6–7) of the IPv4 private form.
const FORM_V4: [u8; 2] = [0x00, 0x04];
/// Subnet ID (bytes 6–7) of the IPv6 private form.
const FORM_V6: [u8; 2] = [0x00, 0x06];

/// The lowest UDP source port that RoCEv2 senders use for flow entropy
/// (the kernel's `IB_ROCE_UDP_ENCAP_VALID_PORT_MIN`): datagrams from
/// 0xC000–0xFFFF are identified by their address alone.
pub const ENTROPY_PORT_MIN: u16 = 0xc000;

/// Private ports the automatic choice picks from: below the entropy range
/// and above the well-known ports.
pub const AUTO_PORTS: std::ops::Range<u16> = 0x8000..ENTROPY_PORT_MIN;

/// The GID of a device bound to `ip`:`port`: the standard RoCEv2 GID on
/// port 4791, the private form on any other port.
///
/// # Examples
///
/// ```
/// use std::net::{IpAddr, Ipv4Addr, SocketAddr};
/// use softverbs::soft::link::udp::addr::{endpoint_of, gid_of};
///
/// let ep = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 5000);
/// let gid = gid_of(ep);
/// assert_eq!(gid.to_string(), "fd73:7665:7262:0004:0000:1388:0a00:0002");
/// assert_eq!(endpoint_of(gid, None), Some(ep));
/// ```
pub fn gid_of(ep: SocketAddr) -> Gid {
    if ep.port() == ROCEV2_UDP_PORT {
        return Gid::from_ip(ep.ip());
    }
    let mut g = [0u8; 16];
    g[..6].copy_from_slice(&PRIVATE_PREFIX);
    match ep.ip() {
        IpAddr::V4(v4) => {
            g[6..8].copy_from_slice(&FORM_V4);
            g[10..12].copy_from_slice(&ep.port().to_be_bytes());
            g[12..].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            g[6..8].copy_from_slice(&FORM_V6);
            g[8..10].copy_from_slice(&ep.port().to_be_bytes());
            g[10..].copy_from_slice(&v6.octets()[10..]);
        }
    }
    Gid(g)
}

/// Whether `gid` is in the private form.
pub fn is_private(gid: Gid) -> bool {
    gid.0[..6] == PRIVATE_PREFIX && (gid.0[6..8] == FORM_V4 || gid.0[6..8] == FORM_V6)
}

/// Where datagrams to `gid` go. `local_v6` is the IPv6 address of the
/// sending device, whose upper 80 bits complete an IPv6 private GID (`None`:
/// IPv6 private GIDs are not resolvable). `None` for a zero GID, a
/// malformed private GID, or an IPv6 private GID without `local_v6`.
pub fn endpoint_of(gid: Gid, local_v6: Option<Ipv6Addr>) -> Option<SocketAddr> {
    if gid.is_zero() {
        return None;
    }
    if gid.0[..6] != PRIVATE_PREFIX {
        return Some(SocketAddr::new(gid.to_ip(), ROCEV2_UDP_PORT));
    }
    let g = gid.0;
    match [g[6], g[7]] {
        FORM_V4 if g[8..10] == [0, 0] => {
            let port = u16::from_be_bytes([g[10], g[11]]);
            let ip = Ipv4Addr::new(g[12], g[13], g[14], g[15]);
            (port != 0).then_some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        FORM_V6 => {
            let port = u16::from_be_bytes([g[8], g[9]]);
            let mut o = local_v6?.octets();
            o[10..].copy_from_slice(&g[10..]);
            (port != 0).then_some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port))
        }
        // Our prefix with an unknown form: treat as an ordinary IPv6
        // address would be wrong (no device owns it); refuse.
        _ => None,
    }
}

/// The GID a datagram from `src` came from, as the receiving device's
/// engine must see it to match the peer GID its QPs were given: the
/// standard GID for source port 4791 and the entropy range
/// (`0xC000..=0xFFFF`), the private form for any other port. For an IPv6
/// source outside the receiver's /80 (`local_v6`) the private form cannot
/// be expressed and the standard GID is returned.
pub fn source_gid(src: SocketAddr, local_v6: Option<Ipv6Addr>) -> Gid {
    let port = src.port();
    if port == ROCEV2_UDP_PORT || port >= ENTROPY_PORT_MIN || port == 0 {
        return Gid::from_ip(src.ip());
    }
    if let IpAddr::V6(v6) = src.ip() {
        let same_80 = local_v6.is_some_and(|l| l.octets()[..10] == v6.octets()[..10]);
        if !same_80 {
            return Gid::from_ip(src.ip());
        }
    }
    gid_of(src)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: u8, b: u8, c: u8, d: u8, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(a, b, c, d)), port)
    }

    #[test]
    fn standard_port_gives_standard_gid() {
        let ep = v4(10, 1, 2, 3, 4791);
        let g = gid_of(ep);
        assert_eq!(g, Gid::from_ip(ep.ip()));
        assert!(!is_private(g));
        assert_eq!(endpoint_of(g, None), Some(ep));
        assert_eq!(source_gid(ep, None), g);
        let v6: SocketAddr = "[fd00::5]:4791".parse().unwrap();
        assert_eq!(endpoint_of(gid_of(v6), None), Some(v6));
    }

    #[test]
    fn private_v4_round_trip() {
        for ep in [v4(127, 0, 0, 1, 1), v4(10, 9, 8, 7, 0xbfff), v4(192, 168, 1, 1, 33000)] {
            let g = gid_of(ep);
            assert!(is_private(g));
            assert_eq!(endpoint_of(g, None), Some(ep));
            assert_eq!(source_gid(ep, None), g);
            // The engine sees the GID as an IPv6 address that round-trips.
            assert_eq!(Gid::from_ip(g.to_ip()), g);
        }
    }

    #[test]
    fn private_v6_needs_the_local_prefix() {
        let local: Ipv6Addr = "fd00:1:2:3:4::1".parse().unwrap();
        let peer: SocketAddr = "[fd00:1:2:3:4::2]:40000".parse().unwrap();
        let g = gid_of(peer);
        assert!(is_private(g));
        assert_eq!(endpoint_of(g, Some(local)), Some(peer));
        assert_eq!(endpoint_of(g, None), None);
        assert_eq!(source_gid(peer, Some(local)), g);
        let far: SocketAddr = "[fd99::2]:40000".parse().unwrap();
        assert_eq!(source_gid(far, Some(local)), Gid::from_ip(far.ip()));
        let lo: SocketAddr = "[::1]:40001".parse().unwrap();
        assert_eq!(endpoint_of(gid_of(lo), Some(Ipv6Addr::LOCALHOST)), Some(lo));
    }

    #[test]
    fn entropy_ports_are_anonymous() {
        let ep = v4(10, 0, 0, 1, 0xc123);
        assert_eq!(source_gid(ep, None), Gid::from_ip(ep.ip()));
        assert_eq!(
            source_gid(v4(10, 0, 0, 1, 0xbfff), None),
            gid_of(v4(10, 0, 0, 1, 0xbfff))
        );
    }

    #[test]
    fn malformed_private_gids_do_not_resolve() {
        let mut g = gid_of(v4(1, 2, 3, 4, 5000));
        g.0[6] = 9;
        assert_eq!(endpoint_of(g, None), None);
        let mut g = gid_of(v4(1, 2, 3, 4, 5000));
        g.0[10] = 0;
        g.0[11] = 0;
        assert_eq!(endpoint_of(g, None), None, "port 0");
        assert_eq!(endpoint_of(Gid::ZERO, None), None);
    }
}
