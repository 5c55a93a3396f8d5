//! The opcode table: numbering, completeness, lengths against rxe.

use super::super::*;

#[test]
fn every_byte_round_trips() {
    for code in 0..=u8::MAX {
        let op = Opcode::from(code);
        assert_eq!(u8::from(op), code, "{op:?}");
    }
}

#[test]
fn unknown_is_only_used_for_unlisted_values() {
    // A known opcode must never be constructible as Unknown(its value)
    // through `From<u8>`, and every listed opcode must be reachable.
    let known: Vec<Opcode> = (0..=u8::MAX)
        .map(Opcode::from)
        .filter(|op| !matches!(op, Opcode::Unknown(_)))
        .collect();
    assert_eq!(known.len(), Opcode::ALL.len() + 1); // + CNP
    for op in Opcode::ALL {
        assert!(known.contains(&op));
        assert!(op.info().is_some(), "{op:?} has no table row");
    }
    assert_eq!(Opcode::Cnp.info(), None);
    assert_eq!(Opcode::Unknown(0x15).info(), None);
}

#[test]
fn all_is_sorted_and_transport_matches_top_bits() {
    let codes: Vec<u8> = Opcode::ALL.iter().map(|&op| u8::from(op)).collect();
    assert!(codes.windows(2).all(|w| w[0] < w[1]));
    for op in Opcode::ALL {
        let info = op.info().unwrap();
        let expected = match u8::from(op) >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            3 => Transport::Ud,
            other => panic!("unexpected transport bits {other}"),
        };
        assert_eq!(info.transport, expected, "{op:?}");
    }
}

#[test]
fn header_lengths_match_rxe() {
    // Values of rxe_opcode[].length (BTH included).
    let expected = [
        (Opcode::RcSendFirst, 12),
        (Opcode::RcSendLastWithImmediate, 16),
        (Opcode::RcRdmaWriteFirst, 28),
        (Opcode::RcRdmaWriteMiddle, 12),
        (Opcode::RcRdmaWriteOnlyWithImmediate, 32),
        (Opcode::RcRdmaReadRequest, 28),
        (Opcode::RcRdmaReadResponseFirst, 16),
        (Opcode::RcRdmaReadResponseMiddle, 12),
        (Opcode::RcAcknowledge, 16),
        (Opcode::RcAtomicAcknowledge, 24),
        (Opcode::RcCompareSwap, 40),
        (Opcode::RcFetchAdd, 40),
        (Opcode::RcSendOnlyWithInvalidate, 16),
        (Opcode::UcRdmaWriteOnly, 28),
        (Opcode::UdSendOnly, 20),
        (Opcode::UdSendOnlyWithImmediate, 24),
    ];
    for (op, len) in expected {
        assert_eq!(op.header_len(), Some(len), "{op:?}");
    }
    assert_eq!(Opcode::Unknown(0xff).header_len(), None);
}

#[test]
fn payload_and_direction_follow_kind() {
    for op in Opcode::ALL {
        let info = op.info().unwrap();
        assert_eq!(info.has_payload, info.kind.has_payload());
        assert_eq!(info.direction, info.kind.direction());
        assert_eq!(info.is_request(), info.direction == Direction::Request);
        if !info.has_payload {
            assert_eq!(info.position, Position::Only, "{op:?}");
        }
    }
    let ack = Opcode::RcAcknowledge.info().unwrap();
    assert!(!ack.has_payload && !ack.is_request());
}

#[test]
fn find_inverts_the_table() {
    for op in Opcode::ALL {
        let info = op.info().unwrap();
        let found = Opcode::find(
            info.transport,
            info.kind,
            info.position,
            info.headers.immdt,
            info.headers.ieth,
        );
        assert_eq!(found, Some(op));
    }
    let nothing = Opcode::find(Transport::Ud, OpKind::Send, Position::First, false, false);
    assert_eq!(nothing, None);
    let no_uc_invalidate = Opcode::find(Transport::Uc, OpKind::Send, Position::Only, false, true);
    assert_eq!(no_uc_invalidate, None);
    // Exactly the table's combinations exist: no two opcodes share one,
    // and nothing else finds an opcode.
    let kinds = [
        OpKind::Send,
        OpKind::Write,
        OpKind::ReadRequest,
        OpKind::ReadResponse,
        OpKind::Ack,
        OpKind::AtomicAck,
        OpKind::CompareSwap,
        OpKind::FetchAdd,
    ];
    let positions = [Position::First, Position::Middle, Position::Last, Position::Only];
    let mut found = 0;
    for t in [Transport::Rc, Transport::Uc, Transport::Ud] {
        for k in kinds {
            for p in positions {
                for (imm, inv) in [(false, false), (true, false), (false, true), (true, true)] {
                    if let Some(op) = Opcode::find(t, k, p, imm, inv) {
                        let i = op.info().unwrap();
                        assert_eq!((i.transport, i.kind, i.position), (t, k, p), "{op:?}");
                        assert_eq!((i.headers.immdt, i.headers.ieth), (imm, inv), "{op:?}");
                        found += 1;
                    }
                }
            }
        }
    }
    assert_eq!(found, Opcode::ALL.len());
}

#[test]
fn names_and_display() {
    assert_eq!(Opcode::RcSendFirst.to_string(), "RC_SEND_FIRST");
    assert_eq!(Opcode::Unknown(0x15).to_string(), "UNKNOWN(0x15)");
    assert_eq!(Opcode::Cnp.name(), "CNP");
    assert!(Position::Only.starts_message() && Position::Only.ends_message());
    assert!(!Position::Middle.starts_message() && !Position::Middle.ends_message());
}
