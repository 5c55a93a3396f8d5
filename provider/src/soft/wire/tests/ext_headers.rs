//! RETH, DETH, AtomicETH, AtomicAckETH, ImmDt and IETH on fixed bytes.

use super::super::*;

/// Checks that every strict prefix of `bytes` is rejected by `parse` and
/// that `emit` refuses every too-small buffer.
fn assert_length_checks<R>(
    bytes: &[u8],
    repr: &R,
    parse: fn(&[u8]) -> Result<R, WireError>,
    emit: fn(&R, &mut [u8]) -> Result<(), WireError>,
) where
    R: PartialEq + core::fmt::Debug,
{
    for len in 0..bytes.len() {
        assert_eq!(parse(&bytes[..len]), Err(WireError::Truncated), "len {len}");
        let mut out = vec![0u8; len];
        assert_eq!(emit(repr, &mut out), Err(WireError::BufferTooSmall));
    }
    // Longer input is fine: headers are parsed from a prefix.
    let mut long = bytes.to_vec();
    long.extend_from_slice(&[0x5a; 7]);
    assert_eq!(parse(&long).as_ref(), Ok(repr));
    let mut out = vec![0xeeu8; bytes.len() + 3];
    emit(repr, &mut out).unwrap();
    assert_eq!(&out[..bytes.len()], bytes);
    assert_eq!(&out[bytes.len()..], &[0xee; 3], "emit wrote past the header");
}

#[test]
fn reth_fixed_bytes() {
    let bytes = [
        0x00, 0x00, 0x7f, 0x7e, 0x91, 0x00, 0x00, 0x00, // va
        0x01, 0x70, 0x9a, 0x33, // rkey
        0x00, 0x00, 0x00, 0x80, // dma length
    ];
    let repr = RethRepr {
        va: 0x7f7e_9100_0000,
        rkey: 0x0170_9a33,
        dma_len: 128,
    };
    assert_eq!(RethRepr::parse(&bytes), Ok(repr));
    let view = Reth::new_checked(&bytes).unwrap();
    assert_eq!((view.va(), view.rkey(), view.dma_len()), (repr.va, repr.rkey, 128));
    assert_eq!(Reth::LEN, 16);
    assert_eq!(RethRepr::LEN, 16);
    assert_length_checks(&bytes, &repr, RethRepr::parse, RethRepr::emit);

    let mut buf = [0u8; 16];
    let view = Reth::new_checked_mut(&mut buf).unwrap();
    view.set_va(repr.va);
    view.set_rkey(repr.rkey);
    view.set_dma_len(repr.dma_len);
    assert_eq!(buf, bytes);
}

#[test]
fn deth_fixed_bytes() {
    let bytes = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x2a];
    let repr = DethRepr {
        qkey: 0x1111_1111,
        src_qpn: Qpn::new(42),
    };
    assert_eq!(DethRepr::parse(&bytes), Ok(repr));
    assert_eq!(Deth::LEN, 8);
    assert_length_checks(&bytes, &repr, DethRepr::parse, DethRepr::emit);

    // The reserved byte is ignored on parse, kept by the view's setter and
    // zeroed by emit.
    let mut dirty = bytes;
    dirty[4] = 0xa5;
    assert_eq!(DethRepr::parse(&dirty), Ok(repr));
    let view = Deth::new_checked_mut(&mut dirty).unwrap();
    view.set_src_qpn(Qpn::new(0xfe_dcba));
    view.set_qkey(7);
    assert_eq!(view.src_qpn(), Qpn::new(0xfe_dcba));
    assert_eq!(view.qkey(), 7);
    assert_eq!(dirty, [0, 0, 0, 7, 0xa5, 0xfe, 0xdc, 0xba]);
}

#[test]
fn atomic_eth_fixed_bytes() {
    let bytes = [
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x10, 0x08, // va
        0xde, 0xad, 0xbe, 0xef, // rkey
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // swap/add
        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // compare
    ];
    let repr = AtomicEthRepr {
        va: 0x1_0000_1008,
        rkey: 0xdead_beef,
        swap_add: 0x0102_0304_0506_0708,
        compare: 0x1112_1314_1516_1718,
    };
    assert_eq!(AtomicEthRepr::parse(&bytes), Ok(repr));
    assert_eq!(AtomicEth::LEN, 28);
    assert_length_checks(&bytes, &repr, AtomicEthRepr::parse, AtomicEthRepr::emit);

    let mut buf = [0u8; 28];
    let view = AtomicEth::new_checked_mut(&mut buf).unwrap();
    view.set_va(repr.va);
    view.set_rkey(repr.rkey);
    view.set_swap_add(repr.swap_add);
    view.set_compare(repr.compare);
    assert_eq!(
        (view.va(), view.rkey(), view.swap_add(), view.compare()),
        (repr.va, repr.rkey, repr.swap_add, repr.compare)
    );
    assert_eq!(buf, bytes);
}

#[test]
fn atomic_ack_eth_fixed_bytes() {
    let bytes = [0x80, 0, 0, 0, 0, 0, 0, 0x01];
    let repr = AtomicAckEthRepr {
        original_value: 0x8000_0000_0000_0001,
    };
    assert_eq!(AtomicAckEthRepr::parse(&bytes), Ok(repr));
    assert_eq!(AtomicAckEth::LEN, 8);
    assert_eq!(
        AtomicAckEth::new_checked(&bytes).unwrap().original_value(),
        repr.original_value
    );
    assert_length_checks(&bytes, &repr, AtomicAckEthRepr::parse, AtomicAckEthRepr::emit);
}

#[test]
fn immdt_fixed_bytes() {
    let bytes = [0x12, 0x34, 0x56, 0x78];
    let repr = ImmDtRepr { data: bytes };
    assert_eq!(ImmDtRepr::parse(&bytes), Ok(repr));
    assert_eq!(repr.be_value(), 0x1234_5678);
    assert_eq!(ImmDtRepr::from_be_value(0x1234_5678), repr);
    assert_eq!(ImmDt::LEN, 4);
    assert_length_checks(&bytes, &repr, ImmDtRepr::parse, ImmDtRepr::emit);

    let mut buf = [0u8; 4];
    ImmDt::new_checked_mut(&mut buf).unwrap().set_data(bytes);
    assert_eq!(ImmDt::new_checked(&buf).unwrap().data(), bytes);
}

#[test]
fn ieth_fixed_bytes() {
    let bytes = [0x00, 0x00, 0x12, 0x07];
    let repr = IethRepr { rkey: 0x1207 };
    assert_eq!(IethRepr::parse(&bytes), Ok(repr));
    assert_eq!(Ieth::LEN, 4);
    assert_length_checks(&bytes, &repr, IethRepr::parse, IethRepr::emit);

    let mut buf = [0u8; 4];
    let view = Ieth::new_checked_mut(&mut buf).unwrap();
    view.set_rkey(0x1207);
    assert_eq!(view.rkey(), 0x1207);
    assert_eq!(buf, bytes);
}

#[test]
fn aeth_and_bth_lengths_via_shared_helper() {
    let aeth = [0x1f, 0x00, 0x00, 0x05];
    let repr = AethRepr {
        syndrome: Syndrome::ACK,
        msn: 5,
    };
    assert_length_checks(&aeth, &repr, AethRepr::parse, AethRepr::emit);

    let bth = [0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x10];
    let repr = BthRepr::new(Opcode::RcAcknowledge, Qpn::new(9), Psn::new(16));
    assert_length_checks(&bth, &repr, BthRepr::parse, BthRepr::emit);
}
