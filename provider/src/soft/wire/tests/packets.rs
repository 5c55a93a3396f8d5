//! Whole packets: every opcode through emit and parse, the pad logic, and
//! each validation error.

use super::super::*;

/// Headers for `opcode` with every extension header its table row lists,
/// filled with distinctive values.
pub(super) fn headers_for(opcode: Opcode) -> PacketRepr {
    let info = opcode.info().expect("a table opcode");
    let mut bth = BthRepr::new(opcode, Qpn::new(0x00_beef), Psn::new(0xff_fffe));
    bth.solicited = info.position.ends_message() && info.is_request();
    bth.ack_req = info.is_request();
    let mut headers = PacketRepr::new(bth);
    let want = info.headers;
    if want.deth {
        headers.deth = Some(DethRepr {
            qkey: 0x8001_0002,
            src_qpn: Qpn::new(0x12_3456),
        });
    }
    if want.reth {
        headers.reth = Some(RethRepr {
            va: 0x0011_2233_4455_6677,
            rkey: 0x8899_aabb,
            dma_len: 0x0001_0000,
        });
    }
    if want.atomic_eth {
        headers.atomic_eth = Some(AtomicEthRepr {
            va: 0x1000,
            rkey: 0x55,
            swap_add: 3,
            compare: 4,
        });
    }
    if want.aeth {
        headers.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK,
            msn: 0x00_0102,
        });
    }
    if want.atomic_ack_eth {
        headers.atomic_ack_eth = Some(AtomicAckEthRepr {
            original_value: u64::MAX - 1,
        });
    }
    if want.immdt {
        headers.immdt = Some(ImmDtRepr::from_be_value(0x0a0b_0c0d));
    }
    if want.ieth {
        headers.ieth = Some(IethRepr { rkey: 0x0000_1207 });
    }
    headers
}

#[test]
fn every_opcode_round_trips_with_every_pad() {
    let payload: Vec<u8> = (1..=9).collect();
    for opcode in Opcode::ALL {
        let info = opcode.info().unwrap();
        let headers = headers_for(opcode);
        assert_eq!(headers.present_headers(), info.headers);
        assert_eq!(headers.header_len(), info.header_len());
        let lengths: &[usize] = if info.has_payload { &[0, 1, 2, 3, 4, 5, 9] } else { &[0] };
        for &len in lengths {
            let payload = &payload[..len];
            let mut buf = [0u8; 128];
            let written = headers.emit(payload, &mut buf).unwrap();
            let pad = pad_len(len);
            assert_eq!(written, info.header_len() + len + pad + ICRC_LEN);
            assert_eq!(written, headers.packet_len(len));
            assert_eq!(written % 4, 0);
            assert_eq!(buf[0], u8::from(opcode));
            assert_eq!(usize::from((buf[1] >> 4) & 3), pad, "pad count field");

            let parsed = Packet::parse(&buf[..written]).unwrap();
            let mut expected = headers;
            expected.bth.pad_count = pad as u8;
            assert_eq!(parsed.headers, expected, "{opcode:?}");
            assert_eq!(parsed.info, info);
            assert_eq!(parsed.payload, payload);
            assert_eq!(parsed.icrc, 0, "emit leaves the ICRC zero");
            // Pad bytes are zero.
            let pad_start = info.header_len() + len;
            assert!(buf[pad_start..written].iter().all(|&b| b == 0));

            let mut again = [0u8; 128];
            let n = parsed.headers.emit(parsed.payload, &mut again).unwrap();
            assert_eq!(again[..n], buf[..written]);
        }
    }
}

#[test]
fn extension_headers_sit_in_wire_order() {
    // UD SEND_ONLY_WITH_IMMEDIATE: BTH, DETH, ImmDt, payload "xy", pad 2.
    let mut headers = PacketRepr::new(BthRepr::new(
        Opcode::UdSendOnlyWithImmediate,
        Qpn::new(0x00_0001),
        Psn::new(0x00_0007),
    ));
    headers.deth = Some(DethRepr {
        qkey: 0x8001_0000,
        src_qpn: Qpn::new(0x00_0042),
    });
    headers.immdt = Some(ImmDtRepr { data: [1, 2, 3, 4] });
    let mut buf = [0u8; 32];
    let len = headers.emit(b"xy", &mut buf).unwrap();
    #[rustfmt::skip]
    let expected = [
        0x65, 0x20, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x07,
        0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x42,
        0x01, 0x02, 0x03, 0x04,
        b'x', b'y', 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];
    assert_eq!(buf[..len], expected);

    // RC ATOMIC_ACKNOWLEDGE: BTH, AETH, AtomicAckETH.
    let mut headers = PacketRepr::new(BthRepr::new(Opcode::RcAtomicAcknowledge, Qpn::new(2), Psn::new(3)));
    headers.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK,
        msn: 9,
    });
    headers.atomic_ack_eth = Some(AtomicAckEthRepr {
        original_value: 0x0102_0304_0506_0708,
    });
    let len = headers.emit(&[], &mut buf).unwrap();
    #[rustfmt::skip]
    let expected = [
        0x12, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03,
        0x1f, 0x00, 0x00, 0x09,
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
        0x00, 0x00, 0x00, 0x00,
    ];
    assert_eq!(buf[..len], expected);
}

#[test]
fn pad_arithmetic() {
    let pads: Vec<usize> = (0..9).map(pad_len).collect();
    assert_eq!(pads, [0, 3, 2, 1, 0, 3, 2, 1, 0]);
    assert_eq!(pad_len(usize::MAX), 1);
    let headers = headers_for(Opcode::RcSendMiddle);
    assert_eq!(headers.packet_len(0), 16);
    assert_eq!(headers.packet_len(1), 20);
    assert_eq!(headers.packet_len(4096), 12 + 4096 + 4);
    assert_eq!(headers.packet_len(usize::MAX), usize::MAX);
}

/// A valid packet to corrupt: RC SEND_ONLY with payload "abcde" (pad 3).
fn send_only() -> Vec<u8> {
    let mut buf = vec![0u8; 32];
    let len = headers_for(Opcode::RcSendOnly).emit(b"abcde", &mut buf).unwrap();
    buf.truncate(len);
    buf
}

#[test]
fn parse_rejects_each_malformation() {
    let good = send_only();
    assert_eq!(good.len(), 24);
    assert!(Packet::parse(&good).is_ok());

    for len in 0..MIN_PACKET_LEN {
        assert_eq!(Packet::parse(&good[..len]).err(), Some(WireError::Truncated));
    }

    let mut bad = good.clone();
    bad[1] |= 0x02;
    assert_eq!(Packet::parse(&bad).err(), Some(WireError::BadVersion(2)));

    for code in [0x15u8, 0x18, 0x40, 0x60, 0x66, 0xc0, 0xff] {
        let mut bad = good.clone();
        bad[0] = code;
        assert_eq!(
            Packet::parse(&bad).err(),
            Some(WireError::UnknownOpcode(code)),
            "{code:#x}"
        );
    }
    let mut cnp = good.clone();
    cnp[0] = 0x81;
    assert_eq!(Packet::parse(&cnp).err(), Some(WireError::CongestionNotification));

    let mut long = good.clone();
    long.push(0);
    assert_eq!(Packet::parse(&long).err(), Some(WireError::BadLength));
    assert_eq!(Packet::parse(&good[..23]).err(), Some(WireError::BadLength));

    // Pad count 3 needs 3 bytes before the ICRC; with payload+pad = 8 bytes
    // any pad fits, but 0 payload bytes cannot carry pad.
    let mut empty_send = vec![0u8; 16];
    let n = headers_for(Opcode::RcSendOnly).emit(&[], &mut empty_send).unwrap();
    assert_eq!(n, 16);
    empty_send[1] |= 0x30;
    assert_eq!(Packet::parse(&empty_send).err(), Some(WireError::BadPad));
}

#[test]
fn parse_checks_room_for_extension_headers() {
    // RDMA WRITE ONLY needs BTH + RETH (28 bytes) before the ICRC.
    let mut buf = vec![0u8; 40];
    let n = headers_for(Opcode::RcRdmaWriteOnly).emit(b"", &mut buf).unwrap();
    assert_eq!(n, 32);
    for len in (MIN_PACKET_LEN..n).step_by(4) {
        assert_eq!(
            Packet::parse(&buf[..len]).err(),
            Some(WireError::Truncated),
            "len {len}"
        );
    }
    // Same for a header pair: atomic acknowledge is BTH + 4 + 8.
    let n = headers_for(Opcode::RcAtomicAcknowledge).emit(b"", &mut buf).unwrap();
    assert_eq!(n, 28);
    assert_eq!(Packet::parse(&buf[..24]).err(), Some(WireError::Truncated));
    assert!(Packet::parse(&buf[..28]).is_ok());
}

#[test]
fn payload_where_none_is_allowed_is_rejected() {
    for opcode in Opcode::ALL {
        let info = opcode.info().unwrap();
        if info.has_payload {
            continue;
        }
        let mut buf = vec![0u8; 64];
        let n = headers_for(opcode).emit(&[], &mut buf).unwrap();
        // Four more bytes before the ICRC.
        let mut with_payload = buf[..n - 4].to_vec();
        with_payload.extend_from_slice(&[1, 2, 3, 4, 0, 0, 0, 0]);
        assert_eq!(
            Packet::parse(&with_payload).err(),
            Some(WireError::UnexpectedPayload),
            "{opcode:?}"
        );
        // A pad count with no room is bad pad, not payload.
        let mut padded = buf[..n].to_vec();
        padded[1] |= 0x10;
        assert_eq!(Packet::parse(&padded).err(), Some(WireError::BadPad));
        // And emit refuses payload for it.
        assert_eq!(
            headers_for(opcode).emit(b"x", &mut buf).err(),
            Some(WireError::UnexpectedPayload)
        );
    }
}

#[test]
fn emit_checks_headers_and_buffer() {
    let mut buf = [0x77u8; 64];

    let mut missing = headers_for(Opcode::RcRdmaWriteFirst);
    missing.reth = None;
    assert_eq!(missing.emit(b"a", &mut buf), Err(WireError::HeaderMismatch));

    let mut extra = headers_for(Opcode::RcSendOnly);
    extra.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK,
        msn: 0,
    });
    assert_eq!(extra.emit(b"a", &mut buf), Err(WireError::HeaderMismatch));

    let unknown = PacketRepr::new(BthRepr::new(Opcode::Unknown(0x15), Qpn::new(1), Psn::ZERO));
    assert_eq!(unknown.emit(&[], &mut buf), Err(WireError::UnknownOpcode(0x15)));
    let cnp = PacketRepr::new(BthRepr::new(Opcode::Cnp, Qpn::new(1), Psn::ZERO));
    assert_eq!(cnp.emit(&[], &mut buf), Err(WireError::CongestionNotification));

    let headers = headers_for(Opcode::RcSendOnly);
    let need = headers.packet_len(5);
    assert_eq!(
        headers.emit(b"abcde", &mut buf[..need - 1]),
        Err(WireError::BufferTooSmall)
    );
    assert!(buf.iter().all(|&b| b == 0x77), "nothing written on error");
    assert_eq!(headers.emit(b"abcde", &mut buf[..need]), Ok(need));
}

/// Every SEND and WRITE opcode (what the requester emits through
/// [`MessageHeaders`]), with the fields of `headers_for`.
fn message_opcodes() -> Vec<Opcode> {
    (0..=255u8)
        .map(Opcode::from)
        .filter(|o| o.info().is_some_and(|i| matches!(i.kind, OpKind::Send | OpKind::Write)))
        .collect()
}

/// [`MessageHeaders`] writes what [`PacketRepr::emit_headers`] writes, for
/// every SEND and WRITE opcode, every pad, and BTH flags and fields set and
/// clear: the requester's short emitter is the general one, byte for byte.
#[test]
fn message_headers_match_packet_repr() {
    let opcodes = message_opcodes();
    assert!(opcodes.len() >= 20, "{} SEND/WRITE opcodes", opcodes.len());
    for opcode in opcodes {
        for payload_len in 0..8usize {
            for flags in 0..8u8 {
                let mut h = headers_for(opcode);
                h.bth.solicited = flags & 1 != 0;
                h.bth.ack_req = flags & 2 != 0;
                h.bth.mig_req = flags & 4 != 0;
                h.bth.psn = Psn::new(0x00ab_cdef ^ u32::from(flags));
                let want_len = h.header_len();
                let mut want = vec![0u8; want_len];
                assert_eq!(h.emit_headers(payload_len, &mut want), Ok(want_len), "{opcode:?}");
                let got = MessageHeaders::new(&h.bth, payload_len, h.deth.as_ref(), h.reth.as_ref(), h.immdt, h.ieth);
                assert_eq!(
                    got.as_bytes(),
                    &want[..],
                    "{opcode:?} payload {payload_len} flags {flags}"
                );
            }
        }
    }
}

proptest::proptest! {
    /// The same for arbitrary field values.
    #[test]
    fn message_headers_match_packet_repr_for_any_fields(
        pick in 0usize..64,
        qpn in 0u32..0x0100_0000,
        psn in 0u32..0x0100_0000,
        qkey: u32,
        src_qpn in 0u32..0x0100_0000,
        va: u64,
        rkey: u32,
        dma_len: u32,
        imm: u32,
        payload_len in 0usize..4200,
        solicited: bool,
        ack_req: bool,
    ) {
        let opcodes = message_opcodes();
        let opcode = opcodes[pick % opcodes.len()];
        let mut h = headers_for(opcode);
        h.bth.dest_qpn = Qpn::new(qpn);
        h.bth.psn = Psn::new(psn);
        h.bth.solicited = solicited;
        h.bth.ack_req = ack_req;
        if let Some(d) = &mut h.deth {
            *d = DethRepr { qkey, src_qpn: Qpn::new(src_qpn) };
        }
        if let Some(r) = &mut h.reth {
            *r = RethRepr { va, rkey, dma_len };
        }
        if let Some(i) = &mut h.immdt {
            *i = ImmDtRepr::from_be_value(imm);
        }
        if let Some(i) = &mut h.ieth {
            *i = IethRepr { rkey: imm };
        }
        let mut want = vec![0u8; h.header_len()];
        proptest::prop_assert!(h.emit_headers(payload_len, &mut want).is_ok());
        let got = MessageHeaders::new(&h.bth, payload_len, h.deth.as_ref(), h.reth.as_ref(), h.immdt, h.ieth);
        proptest::prop_assert_eq!(got.as_bytes(), &want[..]);
    }
}
