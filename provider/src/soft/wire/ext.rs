//! Extended transport headers other than the AETH (IBTA Vol. 1 §9.3):
//! RETH, DETH, AtomicETH, AtomicAckETH, ImmDt and IETH.
//!
//! Each has a zero-copy view (`new_checked` / `new_checked_mut`, getters,
//! setters) and a plain `Repr` with `parse`, `emit` and `LEN`. Every
//! multi-byte field is big-endian. R_Keys are plain `u32` here; the typed
//! keys live in the verbs layer.

use zerocopy::byteorder::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::view;
use super::{Qpn, WireError, PSN_MASK};

/// RDMA ETH: target of an RDMA read or write (first or only packet).
///
/// ```text
///  0..8  virtual address   8..12  R_Key   12..16  DMA length
/// ```
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Reth {
    va: U64,
    rkey: U32,
    dma_len: U32,
}

impl Reth {
    /// Length of a RETH in bytes.
    pub const LEN: usize = core::mem::size_of::<Reth>();

    /// Views the first [`Reth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked(buf: &[u8]) -> Result<&Reth, WireError> {
        view::prefix(buf)
    }
    /// Mutably views the first [`Reth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked_mut(buf: &mut [u8]) -> Result<&mut Reth, WireError> {
        view::prefix_mut(buf)
    }
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        self.va.get()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey.get()
    }
    /// Length of the whole RDMA operation in bytes.
    pub fn dma_len(&self) -> u32 {
        self.dma_len.get()
    }
    /// Sets the remote virtual address.
    pub fn set_va(&mut self, va: u64) {
        self.va.set(va);
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.rkey.set(rkey);
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, len: u32) {
        self.dma_len.set(len);
    }
}

/// A decoded RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole RDMA operation in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Length of a RETH in bytes.
    pub const LEN: usize = Reth::LEN;

    /// Decodes the RETH at the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn parse(buf: &[u8]) -> Result<RethRepr, WireError> {
        let reth = Reth::new_checked(buf)?;
        Ok(RethRepr {
            va: reth.va(),
            rkey: reth.rkey(),
            dma_len: reth.dma_len(),
        })
    }

    /// Encodes into the first [`RethRepr::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::BufferTooSmall`] if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let reth = Reth::new_checked_mut(buf).map_err(|_| WireError::BufferTooSmall)?;
        reth.set_va(self.va);
        reth.set_rkey(self.rkey);
        reth.set_dma_len(self.dma_len);
        Ok(())
    }
}

/// Datagram ETH, in every UD packet.
///
/// ```text
///  0..4  Q_Key   byte 4  reserved   5..8  source QP
/// ```
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Deth {
    qkey: U32,
    resv_src_qpn: U32,
}

impl Deth {
    /// Length of a DETH in bytes.
    pub const LEN: usize = core::mem::size_of::<Deth>();

    /// Views the first [`Deth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked(buf: &[u8]) -> Result<&Deth, WireError> {
        view::prefix(buf)
    }
    /// Mutably views the first [`Deth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked_mut(buf: &mut [u8]) -> Result<&mut Deth, WireError> {
        view::prefix_mut(buf)
    }
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        self.qkey.get()
    }
    /// Source QP of the sender.
    pub fn src_qpn(&self) -> Qpn {
        Qpn::new(self.resv_src_qpn.get())
    }
    /// Sets the queue key.
    pub fn set_qkey(&mut self, qkey: u32) {
        self.qkey.set(qkey);
    }
    /// Sets the source QP, keeping the reserved byte.
    pub fn set_src_qpn(&mut self, qpn: Qpn) {
        let word = self.resv_src_qpn.get();
        self.resv_src_qpn.set((word & !PSN_MASK) | qpn.value());
    }
}

/// A decoded DETH. The reserved byte is ignored on parse and sent as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP of the sender.
    pub src_qpn: Qpn,
}

impl DethRepr {
    /// Length of a DETH in bytes.
    pub const LEN: usize = Deth::LEN;

    /// Decodes the DETH at the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn parse(buf: &[u8]) -> Result<DethRepr, WireError> {
        let deth = Deth::new_checked(buf)?;
        Ok(DethRepr {
            qkey: deth.qkey(),
            src_qpn: deth.src_qpn(),
        })
    }

    /// Encodes into the first [`DethRepr::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::BufferTooSmall`] if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let deth = Deth::new_checked_mut(buf).map_err(|_| WireError::BufferTooSmall)?;
        deth.set_qkey(self.qkey);
        deth.resv_src_qpn.set(self.src_qpn.value());
        Ok(())
    }
}

/// Atomic ETH: operands of compare-and-swap and fetch-and-add.
///
/// ```text
///  0..8  VA   8..12  R_Key   12..20  swap (or add) data   20..28  compare data
/// ```
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct AtomicEth {
    va: U64,
    rkey: U32,
    swap_add: U64,
    compare: U64,
}

impl AtomicEth {
    /// Length of an AtomicETH in bytes.
    pub const LEN: usize = core::mem::size_of::<AtomicEth>();

    /// Views the first [`AtomicEth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked(buf: &[u8]) -> Result<&AtomicEth, WireError> {
        view::prefix(buf)
    }
    /// Mutably views the first [`AtomicEth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked_mut(buf: &mut [u8]) -> Result<&mut AtomicEth, WireError> {
        view::prefix_mut(buf)
    }
    /// Remote virtual address (must be 8-byte aligned; the responder checks).
    pub fn va(&self) -> u64 {
        self.va.get()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey.get()
    }
    /// Swap value (compare-and-swap) or addend (fetch-and-add).
    pub fn swap_add(&self) -> u64 {
        self.swap_add.get()
    }
    /// Compare value (compare-and-swap only).
    pub fn compare(&self) -> u64 {
        self.compare.get()
    }
    /// Sets the remote virtual address.
    pub fn set_va(&mut self, va: u64) {
        self.va.set(va);
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.rkey.set(rkey);
    }
    /// Sets the swap value or addend.
    pub fn set_swap_add(&mut self, value: u64) {
        self.swap_add.set(value);
    }
    /// Sets the compare value.
    pub fn set_compare(&mut self, value: u64) {
        self.compare.set(value);
    }
}

/// A decoded AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (compare-and-swap) or addend (fetch-and-add).
    pub swap_add: u64,
    /// Compare value (compare-and-swap; sent as given for fetch-and-add).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Length of an AtomicETH in bytes.
    pub const LEN: usize = AtomicEth::LEN;

    /// Decodes the AtomicETH at the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn parse(buf: &[u8]) -> Result<AtomicEthRepr, WireError> {
        let eth = AtomicEth::new_checked(buf)?;
        Ok(AtomicEthRepr {
            va: eth.va(),
            rkey: eth.rkey(),
            swap_add: eth.swap_add(),
            compare: eth.compare(),
        })
    }

    /// Encodes into the first [`AtomicEthRepr::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::BufferTooSmall`] if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let eth = AtomicEth::new_checked_mut(buf).map_err(|_| WireError::BufferTooSmall)?;
        eth.set_va(self.va);
        eth.set_rkey(self.rkey);
        eth.set_swap_add(self.swap_add);
        eth.set_compare(self.compare);
        Ok(())
    }
}

/// Atomic ACK ETH: the value the target held before the atomic.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct AtomicAckEth {
    original: U64,
}

impl AtomicAckEth {
    /// Length of an AtomicAckETH in bytes.
    pub const LEN: usize = core::mem::size_of::<AtomicAckEth>();

    /// Views the first [`AtomicAckEth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked(buf: &[u8]) -> Result<&AtomicAckEth, WireError> {
        view::prefix(buf)
    }
    /// Mutably views the first [`AtomicAckEth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked_mut(buf: &mut [u8]) -> Result<&mut AtomicAckEth, WireError> {
        view::prefix_mut(buf)
    }
    /// The original remote value.
    pub fn original_value(&self) -> u64 {
        self.original.get()
    }
    /// Sets the original remote value.
    pub fn set_original_value(&mut self, value: u64) {
        self.original.set(value);
    }
}

/// A decoded AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEthRepr {
    /// The original remote value.
    pub original_value: u64,
}

impl AtomicAckEthRepr {
    /// Length of an AtomicAckETH in bytes.
    pub const LEN: usize = AtomicAckEth::LEN;

    /// Decodes the AtomicAckETH at the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn parse(buf: &[u8]) -> Result<AtomicAckEthRepr, WireError> {
        Ok(AtomicAckEthRepr {
            original_value: AtomicAckEth::new_checked(buf)?.original_value(),
        })
    }

    /// Encodes into the first [`AtomicAckEthRepr::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::BufferTooSmall`] if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        AtomicAckEth::new_checked_mut(buf)
            .map_err(|_| WireError::BufferTooSmall)?
            .set_original_value(self.original_value);
        Ok(())
    }
}

/// Immediate data: 4 bytes carried verbatim.
///
/// Verbs hands immediate data over already in network byte order
/// (`ibv_send_wr.imm_data` is `__be32`), so it is kept as raw bytes rather
/// than a number, which avoids double swapping.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ImmDt {
    data: [u8; 4],
}

impl ImmDt {
    /// Length of an ImmDt in bytes.
    pub const LEN: usize = core::mem::size_of::<ImmDt>();

    /// Views the first [`ImmDt::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked(buf: &[u8]) -> Result<&ImmDt, WireError> {
        view::prefix(buf)
    }
    /// Mutably views the first [`ImmDt::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked_mut(buf: &mut [u8]) -> Result<&mut ImmDt, WireError> {
        view::prefix_mut(buf)
    }
    /// The four bytes as sent.
    pub fn data(&self) -> [u8; 4] {
        self.data
    }
    /// Sets the four bytes.
    pub fn set_data(&mut self, data: [u8; 4]) {
        self.data = data;
    }
}

/// Decoded immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ImmDtRepr {
    /// The four bytes as sent (network order).
    pub data: [u8; 4],
}

impl ImmDtRepr {
    /// Length of an ImmDt in bytes.
    pub const LEN: usize = ImmDt::LEN;

    /// Immediate data whose big-endian reading is `value`.
    pub const fn from_be_value(value: u32) -> ImmDtRepr {
        ImmDtRepr {
            data: value.to_be_bytes(),
        }
    }

    /// The big-endian reading of the four bytes.
    pub const fn be_value(&self) -> u32 {
        u32::from_be_bytes(self.data)
    }

    /// Decodes the ImmDt at the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn parse(buf: &[u8]) -> Result<ImmDtRepr, WireError> {
        Ok(ImmDtRepr {
            data: ImmDt::new_checked(buf)?.data(),
        })
    }

    /// Encodes into the first [`ImmDtRepr::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::BufferTooSmall`] if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        ImmDt::new_checked_mut(buf)
            .map_err(|_| WireError::BufferTooSmall)?
            .set_data(self.data);
        Ok(())
    }
}

/// Invalidate ETH: the R_Key a send-with-invalidate invalidates.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Ieth {
    rkey: U32,
}

impl Ieth {
    /// Length of an IETH in bytes.
    pub const LEN: usize = core::mem::size_of::<Ieth>();

    /// Views the first [`Ieth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked(buf: &[u8]) -> Result<&Ieth, WireError> {
        view::prefix(buf)
    }
    /// Mutably views the first [`Ieth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked_mut(buf: &mut [u8]) -> Result<&mut Ieth, WireError> {
        view::prefix_mut(buf)
    }
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        self.rkey.get()
    }
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.rkey.set(rkey);
    }
}

/// A decoded IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IethRepr {
    /// The R_Key to invalidate.
    pub rkey: u32,
}

impl IethRepr {
    /// Length of an IETH in bytes.
    pub const LEN: usize = Ieth::LEN;

    /// Decodes the IETH at the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn parse(buf: &[u8]) -> Result<IethRepr, WireError> {
        Ok(IethRepr {
            rkey: Ieth::new_checked(buf)?.rkey(),
        })
    }

    /// Encodes into the first [`IethRepr::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::BufferTooSmall`] if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        Ieth::new_checked_mut(buf)
            .map_err(|_| WireError::BufferTooSmall)?
            .set_rkey(self.rkey);
        Ok(())
    }
}
