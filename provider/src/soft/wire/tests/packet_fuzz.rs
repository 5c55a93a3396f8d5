//! Property tests: arbitrary and mutated bytes never panic the parser or
//! the views, and whatever parses re-emits to the same bytes (modulo the
//! bits the receiver is told to ignore).

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::super::*;
use super::reference::{datagram_v4, datagram_v6, reference_icrc, PLAIN};

/// Field values for one random packet, turned into headers by `build`.
#[derive(Debug, Clone)]
struct Fields {
    opcode_index: usize,
    flags: [bool; 5],
    pkey: u16,
    qpn: u32,
    psn: u32,
    words: [u64; 4],
    syndrome: u8,
    payload: Vec<u8>,
}

fn fields() -> impl Strategy<Value = Fields> {
    (
        0..Opcode::ALL.len(),
        any::<[bool; 5]>(),
        any::<u16>(),
        any::<u32>(),
        any::<u32>(),
        any::<[u64; 4]>(),
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(
            |(opcode_index, flags, pkey, qpn, psn, words, syndrome, payload)| Fields {
                opcode_index,
                flags,
                pkey,
                qpn,
                psn,
                words,
                syndrome,
                payload,
            },
        )
}

/// Truncating casts pick bits out of the random words on purpose.
#[allow(clippy::cast_possible_truncation)]
fn build(f: &Fields) -> (PacketRepr, Vec<u8>) {
    let opcode = Opcode::ALL[f.opcode_index];
    let info = opcode.info().unwrap();
    let [a, b, c, d] = f.words;
    let mut bth = BthRepr::new(opcode, Qpn::new(f.qpn), Psn::new(f.psn));
    let [se, m, fecn, becn, ack_req] = f.flags;
    bth.solicited = se;
    bth.mig_req = m;
    bth.fecn = fecn;
    bth.becn = becn;
    bth.ack_req = ack_req;
    bth.pkey = Pkey::new(f.pkey);
    let mut headers = PacketRepr::new(bth);
    let want = info.headers;
    if want.deth {
        headers.deth = Some(DethRepr {
            qkey: a as u32,
            src_qpn: Qpn::new((a >> 32) as u32),
        });
    }
    if want.reth {
        headers.reth = Some(RethRepr {
            va: b,
            rkey: c as u32,
            dma_len: (c >> 32) as u32,
        });
    }
    if want.atomic_eth {
        headers.atomic_eth = Some(AtomicEthRepr {
            va: a,
            rkey: b as u32,
            swap_add: c,
            compare: d,
        });
    }
    if want.aeth {
        headers.aeth = Some(AethRepr {
            syndrome: Syndrome::from(f.syndrome),
            msn: d as u32 & PSN_MASK,
        });
    }
    if want.atomic_ack_eth {
        headers.atomic_ack_eth = Some(AtomicAckEthRepr { original_value: a });
    }
    if want.immdt {
        headers.immdt = Some(ImmDtRepr::from_be_value((d >> 32) as u32));
    }
    if want.ieth {
        headers.ieth = Some(IethRepr { rkey: b as u32 });
    }
    let payload = if info.has_payload {
        f.payload.clone()
    } else {
        Vec::new()
    };
    (headers, payload)
}

fn emit(headers: &PacketRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; headers.packet_len(payload.len())];
    let len = headers.emit(payload, &mut buf).unwrap();
    assert_eq!(len, buf.len());
    buf
}

/// `input` with the bits a receiver ignores cleared: BTH reserved bits,
/// the DETH reserved byte, pad contents.
fn normalized(input: &[u8], parsed: &ParsedPacket<'_>) -> Vec<u8> {
    let mut out = input.to_vec();
    out[4] &= 0xc0;
    out[8] &= 0x80;
    if parsed.headers.deth.is_some() {
        out[Bth::LEN + 4] = 0;
    }
    let pad_start = parsed.info.header_len() + parsed.payload.len();
    let icrc_start = out.len() - ICRC_LEN;
    out[pad_start..icrc_start].fill(0);
    out
}

/// What must hold for every successful parse.
fn assert_self_consistent(input: &[u8], parsed: &ParsedPacket<'_>) {
    assert_eq!(parsed.headers.info(), Some(parsed.info));
    assert_eq!(parsed.headers.present_headers(), parsed.info.headers);
    assert!(parsed.info.has_payload || parsed.payload.is_empty());
    assert_eq!(
        parsed.headers.packet_len(parsed.payload.len()),
        input.len(),
        "length accounting"
    );
    let mut again = vec![0u8; input.len()];
    let n = parsed.headers.emit(parsed.payload, &mut again).unwrap();
    assert_eq!(n, input.len());
    again[n - ICRC_LEN..].copy_from_slice(&parsed.icrc.to_le_bytes());
    assert_eq!(again, normalized(input, parsed));
}

/// Runs every checked constructor, getter and repr parser on `bytes`.
fn poke_every_view(bytes: &[u8]) {
    if let Ok(bth) = Bth::new_checked(bytes) {
        let _ = (bth.opcode(), bth.solicited(), bth.mig_req(), bth.pad_count());
        let _ = (bth.tver(), bth.pkey(), bth.fecn(), bth.becn());
        let _ = (bth.dest_qpn(), bth.ack_req(), bth.psn());
    }
    if let Ok(aeth) = Aeth::new_checked(bytes) {
        let _ = (aeth.syndrome(), aeth.msn());
    }
    if let Ok(reth) = Reth::new_checked(bytes) {
        let _ = (reth.va(), reth.rkey(), reth.dma_len());
    }
    if let Ok(deth) = Deth::new_checked(bytes) {
        let _ = (deth.qkey(), deth.src_qpn());
    }
    if let Ok(eth) = AtomicEth::new_checked(bytes) {
        let _ = (eth.va(), eth.rkey(), eth.swap_add(), eth.compare());
    }
    if let Ok(eth) = AtomicAckEth::new_checked(bytes) {
        let _ = eth.original_value();
    }
    if let Ok(imm) = ImmDt::new_checked(bytes) {
        let _ = imm.data();
    }
    if let Ok(ieth) = Ieth::new_checked(bytes) {
        let _ = ieth.rkey();
    }
    let _ = BthRepr::parse(bytes);
    let _ = AethRepr::parse(bytes);
    let _ = RethRepr::parse(bytes);
    let _ = DethRepr::parse(bytes);
    let _ = AtomicEthRepr::parse(bytes);
    let _ = AtomicAckEthRepr::parse(bytes);
    let _ = ImmDtRepr::parse(bytes);
    let _ = IethRepr::parse(bytes);
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        poke_every_view(&bytes);
        if let Ok(parsed) = Packet::parse(&bytes) {
            assert_self_consistent(&bytes, &parsed);
        }
        let ip = IpPseudoHeader::V6 { src: Ipv6Addr::LOCALHOST, dst: Ipv6Addr::LOCALHOST };
        let ports = UdpPorts { src: 1, dst: ROCEV2_UDP_PORT };
        let _ = compute_icrc(&ip, ports, &bytes);
        let _ = check_icrc(&ip, ports, &bytes);
        let mut copy = bytes.clone();
        let _ = fill_icrc(&ip, ports, &mut copy);
    }

    /// Bytes that start like a real packet (a valid opcode and TVer 0) reach
    /// the deeper checks far more often than uniform noise does.
    #[test]
    fn plausible_headers_never_panic(
        opcode_index in 0..Opcode::ALL.len(),
        flags in any::<u8>(),
        mut bytes in proptest::collection::vec(any::<u8>(), 12..200),
    ) {
        bytes[0] = u8::from(Opcode::ALL[opcode_index]);
        bytes[1] = flags & 0xf0;
        let len = bytes.len() & !3;
        bytes.truncate(len);
        if let Ok(parsed) = Packet::parse(&bytes) {
            assert_self_consistent(&bytes, &parsed);
        }
    }

    #[test]
    fn valid_packets_round_trip(f in fields()) {
        let (headers, payload) = build(&f);
        let bytes = emit(&headers, &payload);
        let parsed = Packet::parse(&bytes).unwrap();
        let mut expected = headers;
        expected.bth.pad_count = pad_len(payload.len()) as u8;
        prop_assert_eq!(parsed.headers, expected);
        prop_assert_eq!(parsed.payload, &payload[..]);
        assert_self_consistent(&bytes, &parsed);
    }

    #[test]
    fn mutated_packets_never_panic(
        f in fields(),
        flips in proptest::collection::vec((any::<usize>(), 1..=255u8), 0..6),
        cut in any::<usize>(),
        grow in 0..9usize,
    ) {
        let (headers, payload) = build(&f);
        let mut bytes = emit(&headers, &payload);
        for (at, mask) in flips {
            let i = at % bytes.len();
            bytes[i] ^= mask;
        }
        match cut % 3 {
            0 => bytes.truncate(cut % (bytes.len() + 1)),
            1 => bytes.resize(bytes.len() + grow, 0xab),
            _ => {}
        }
        poke_every_view(&bytes);
        if let Ok(parsed) = Packet::parse(&bytes) {
            assert_self_consistent(&bytes, &parsed);
        }
    }

    #[test]
    fn icrc_matches_the_bitwise_reference(
        f in fields(),
        v4_addrs in any::<([u8; 4], [u8; 4], u16, bool)>(),
        v6_addrs in any::<([u8; 16], [u8; 16])>(),
        ports in any::<(u16, u16)>(),
    ) {
        let (headers, payload) = build(&f);
        let mut roce = emit(&headers, &payload);
        let udp = UdpPorts { src: ports.0, dst: ports.1 };

        let (src, dst, id, df) = v4_addrs;
        let ip4 = IpPseudoHeader::V4 {
            src: Ipv4Addr::from(src),
            dst: Ipv4Addr::from(dst),
            id,
            dont_fragment: df,
        };
        fill_icrc(&ip4, udp, &mut roce).unwrap();
        prop_assert!(check_icrc(&ip4, udp, &roce));
        let d4 = datagram_v4(src, dst, id, df, ports, PLAIN, &roce);
        let icrc = u32::from_le_bytes(roce[roce.len() - 4..].try_into().unwrap());
        prop_assert_eq!(reference_icrc(&d4), icrc);
        prop_assert_eq!(Packet::parse(&roce).unwrap().icrc, icrc);

        let (src6, dst6) = v6_addrs;
        let ip6 = IpPseudoHeader::V6 { src: Ipv6Addr::from(src6), dst: Ipv6Addr::from(dst6) };
        fill_icrc(&ip6, udp, &mut roce).unwrap();
        let d6 = datagram_v6(src6, dst6, ports, PLAIN, 64, &roce);
        let icrc6 = u32::from_le_bytes(roce[roce.len() - 4..].try_into().unwrap());
        prop_assert_eq!(reference_icrc(&d6), icrc6);
        prop_assert!(check_icrc(&ip6, udp, &roce));
    }
}
