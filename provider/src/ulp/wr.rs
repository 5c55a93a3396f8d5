//! Owned work requests: what the layer posts, keeps alive until the WR
//! retires, and can queue (RDMA READs beyond the initiator depth).

use std::sync::Arc;

use crate::verbs::{verr, AccessFlags, Mr, RemoteAddr, Result, SendFlags, SendOp, SendWr, Sge, WorkCompletion};

/// A completion callback: called with the completion of the request it
/// was posted with (see [`UlpQp::post`](super::UlpQp::post) for exactly
/// when).
pub type Callback = Box<dyn FnOnce(&WorkCompletion) + Send + 'static>;

/// A range of registered memory the layer keeps alive (it holds the
/// `Arc<Mr>`) until every WR using it has retired; or, made with
/// [`LocalBuf::from_static`], a range of an MR that lives for the rest of
/// the process, which needs no keeping (no reference count per request).
///
/// The range is checked against the MR once, when the buffer is made, and
/// its scatter entry (address and local key) is kept: a WR over it is
/// built without asking the MR again. A buffer made before the MR was
/// re-registered ([`Mr::rereg`]) still names the old key and address: the
/// device refuses it (a local protection error completes the request),
/// so make buffers again after re-registering.
#[derive(Clone)]
pub struct LocalBuf {
    mr: MrRef,
    offset: u64,
    /// The entry's address and key, as the MR gave them at construction.
    sge_addr: u64,
    lkey: u32,
    len: u32,
}

impl std::fmt::Debug for LocalBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBuf")
            .field("lkey", &self.mr.lkey())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// How a buffer holds its MR.
#[derive(Clone)]
pub(crate) enum MrRef {
    /// Counted: kept alive by the buffer and the requests posted with it.
    Counted(Arc<Mr>),
    /// Never dropped.
    Static(&'static Mr),
}

impl MrRef {
    /// What a request must keep to keep the MR alive (nothing for a
    /// `'static` one).
    #[inline]
    pub(crate) fn into_kept(self) -> Option<Arc<Mr>> {
        match self {
            MrRef::Counted(mr) => Some(mr),
            MrRef::Static(_) => None,
        }
    }
}

impl std::ops::Deref for MrRef {
    type Target = Mr;
    #[inline]
    fn deref(&self) -> &Mr {
        match self {
            MrRef::Counted(mr) => mr,
            MrRef::Static(mr) => mr,
        }
    }
}

impl LocalBuf {
    /// `len` bytes at `offset` of `mr`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the MR.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use softverbs::ulp::LocalBuf;
    /// # use softverbs::verbs::AccessFlags;
    /// let devs = softverbs::soft::embedded_default()?;
    /// let pd = devs[0].open()?.alloc_pd()?;
    /// let mr = Arc::new(pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
    /// let buf = LocalBuf::new(&mr, 512, 1024)?;
    /// assert_eq!(buf.len(), 1024);
    /// assert!(LocalBuf::new(&mr, 4000, 200).is_err());
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn new(mr: &Arc<Mr>, offset: u64, len: u32) -> Result<LocalBuf> {
        let sge = mr.sge(offset, len)?;
        Ok(LocalBuf {
            sge_addr: sge.addr(),
            lkey: sge.lkey(),
            mr: MrRef::Counted(mr.clone()),
            offset,
            len,
        })
    }

    /// `len` bytes at `offset` of `mr`, an MR that lives for the rest of
    /// the process (a server's registered pool, made once and leaked, or
    /// kept in a `static`): the buffer and the requests posted with it
    /// hold no reference count of it, which [`LocalBuf::new`] takes per
    /// buffer (an atomic increment, and a decrement when the request
    /// retires).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the MR.
    ///
    /// # Examples
    ///
    /// ```
    /// # use softverbs::ulp::LocalBuf;
    /// # use softverbs::verbs::AccessFlags;
    /// let pd = softverbs::soft::embedded_default()?[0].open()?.alloc_pd()?;
    /// let pool: &'static _ = Box::leak(Box::new(pd.alloc_mr(1 << 20, AccessFlags::LOCAL_WRITE)?));
    /// let buf = LocalBuf::from_static(pool, 4096, 4096)?;
    /// assert_eq!((buf.offset(), buf.len()), (4096, 4096));
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn from_static(mr: &'static Mr, offset: u64, len: u32) -> Result<LocalBuf> {
        let sge = mr.sge(offset, len)?;
        Ok(LocalBuf {
            sge_addr: sge.addr(),
            lkey: sge.lkey(),
            mr: MrRef::Static(mr),
            offset,
            len,
        })
    }

    /// The whole MR.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the MR is longer than 2^32-1 bytes.
    pub fn whole(mr: &Arc<Mr>) -> Result<LocalBuf> {
        let len = u32::try_from(mr.length()).map_err(|_| {
            verr!(
                MemoryAccess,
                InvalidArgument,
                "an MR of {} bytes is too long for one SGE",
                mr.length()
            )
        })?;
        LocalBuf::new(mr, 0, len)
    }

    /// The MR.
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// Offset in the MR.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address (as a fast registration maps it).
    pub fn addr(&self) -> u64 {
        self.mr.addr() + self.offset
    }

    /// The verbs entry, as checked at construction (the buffer keeps its
    /// MR alive, so the entry stays valid for as long as it is borrowed).
    #[inline]
    pub(crate) fn sge(&self) -> Sge<'_> {
        Sge::checked(self.sge_addr, self.len, self.lkey)
    }
}

/// What a posted WR keeps alive ([`UlpWr::into_kept`]).
pub(crate) enum Kept {
    /// At most one MR.
    Mr(Option<Arc<Mr>>),
    /// The WR itself.
    Whole(UlpWr),
}

/// The operation of a work request posted through the layer (the
/// application-visible subset of [`SendOp`]; registration and invalidation
/// WRs are built by the layer itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UlpOp {
    /// Send.
    Send,
    /// Send with immediate data.
    SendWithImm(u32),
    /// Send that invalidates `rkey` at the peer.
    SendWithInv(u32),
    /// RDMA WRITE.
    Write(RemoteAddr),
    /// RDMA WRITE with immediate data.
    WriteWithImm(RemoteAddr, u32),
    /// RDMA READ into the local scatter list.
    Read(RemoteAddr),
    /// Atomic compare and swap (remote, compare, swap).
    CompareSwap(RemoteAddr, u64, u64),
    /// Atomic fetch and add (remote, add).
    FetchAdd(RemoteAddr, u64),
}

impl UlpOp {
    /// The verbs operation.
    #[inline]
    pub(crate) fn send_op(self) -> SendOp<'static> {
        match self {
            UlpOp::Send => SendOp::Send,
            UlpOp::SendWithImm(imm) => SendOp::SendWithImm { imm },
            UlpOp::SendWithInv(rkey) => SendOp::SendWithInv { rkey },
            UlpOp::Write(remote) => SendOp::Write { remote },
            UlpOp::WriteWithImm(remote, imm) => SendOp::WriteWithImm { remote, imm },
            UlpOp::Read(remote) => SendOp::Read { remote },
            UlpOp::CompareSwap(remote, compare, swap) => SendOp::CompareSwap { remote, compare, swap },
            UlpOp::FetchAdd(remote, add) => SendOp::FetchAdd { remote, add },
        }
    }

    /// Whether the operation uses one of the QP's outstanding
    /// READ/atomic credits (`max_rd_atomic`).
    pub fn is_rd_atomic(&self) -> bool {
        matches!(self, UlpOp::Read(_) | UlpOp::CompareSwap(..) | UlpOp::FetchAdd(..))
    }
}

/// A local scatter list: one buffer kept inline (the common case: no
/// allocation per request), or any number in a `Vec`. Built from a
/// [`LocalBuf`] or a `Vec<LocalBuf>` wherever the layer takes one.
///
/// # Examples
///
/// ```
/// # use std::sync::Arc;
/// use softverbs::ulp::{LocalBuf, Sgl, UlpWr};
/// # use softverbs::verbs::{AccessFlags, RemoteAddr};
/// # let pd = softverbs::soft::embedded_default()?[0].open()?.alloc_pd()?;
/// let mr = Arc::new(pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
/// let remote = RemoteAddr { addr: 0x1000, rkey: 7 };
/// // One buffer: nothing allocated for the list.
/// let one = UlpWr::write(LocalBuf::new(&mr, 0, 8)?, remote);
/// let two: Sgl = vec![LocalBuf::new(&mr, 0, 8)?, LocalBuf::new(&mr, 64, 8)?].into();
/// assert_eq!((format!("{one:?}").matches("LocalBuf").count(), two.len()), (1, 2));
/// # Ok::<(), softverbs::verbs::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Sgl(SglRepr);

#[derive(Clone)]
enum SglRepr {
    One(LocalBuf),
    Many(Vec<LocalBuf>),
}

impl Default for SglRepr {
    fn default() -> Self {
        SglRepr::Many(Vec::new())
    }
}

impl Sgl {
    /// The buffers.
    pub fn as_slice(&self) -> &[LocalBuf] {
        match &self.0 {
            SglRepr::One(b) => std::slice::from_ref(b),
            SglRepr::Many(v) => v,
        }
    }
}

impl std::ops::Deref for Sgl {
    type Target = [LocalBuf];
    fn deref(&self) -> &[LocalBuf] {
        self.as_slice()
    }
}

impl std::fmt::Debug for Sgl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl From<LocalBuf> for Sgl {
    fn from(b: LocalBuf) -> Sgl {
        Sgl(SglRepr::One(b))
    }
}

impl From<Vec<LocalBuf>> for Sgl {
    fn from(v: Vec<LocalBuf>) -> Sgl {
        Sgl(SglRepr::Many(v))
    }
}

/// What one WR of a chain does.
pub(crate) enum WrKind {
    Op(UlpOp),
    RegMr { mr: Arc<Mr>, key: u32, access: AccessFlags },
    LocalInv { key: u32 },
}

/// A send-queue work request owned by the layer.
pub struct UlpWr {
    pub(crate) kind: WrKind,
    pub(crate) sgl: Sgl,
    /// A single entry over a fast-registration MR the chain registers
    /// (address, length, new key): its key exists only once the chain's
    /// REG_MR is posted, so no checked [`Sge`] can be made for it.
    pub(crate) frmr_sge: Option<(u64, u32, u32)>,
    /// Keeps the fast-registration MR of `frmr_sge` alive.
    pub(crate) frmr: Option<Arc<Mr>>,
    /// Inline data, copied at post time: short payloads (commands,
    /// replies) stay in the WR, longer ones go to the heap.
    pub(crate) inline: Option<InlineData>,
    pub(crate) flags: SendFlags,
}

/// The inline data of a [`UlpWr`]: up to 32 bytes without an allocation.
pub(crate) type InlineData = smallvec::SmallVec<[u8; 32]>;

impl std::fmt::Debug for UlpWr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            WrKind::Op(op) => format!("{op:?}"),
            WrKind::RegMr { key, access, .. } => format!("RegMr {{ key: {key:#x}, access: {access:?} }}"),
            WrKind::LocalInv { key } => format!("LocalInv {{ key: {key:#x} }}"),
        };
        f.debug_struct("UlpWr")
            .field("kind", &kind)
            .field("sgl", &self.sgl)
            .field("flags", &self.flags)
            .finish_non_exhaustive()
    }
}

impl UlpWr {
    /// A work request of `op` over `sgl` (one [`LocalBuf`], kept inline,
    /// or a `Vec` of them).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use softverbs::ulp::{LocalBuf, UlpOp, UlpWr};
    /// # use softverbs::verbs::{AccessFlags, RemoteAddr};
    /// # let devs = softverbs::soft::embedded_default()?;
    /// # let pd = devs[0].open()?.alloc_pd()?;
    /// let mr = Arc::new(pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
    /// let wr = UlpWr::new(UlpOp::Read(RemoteAddr { addr: 0x1000, rkey: 7 }), vec![LocalBuf::whole(&mr)?]);
    /// assert!(wr.is_rd_atomic());
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn new(op: UlpOp, sgl: impl Into<Sgl>) -> UlpWr {
        UlpWr {
            kind: WrKind::Op(op),
            sgl: sgl.into(),
            frmr_sge: None,
            frmr: None,
            inline: None,
            flags: SendFlags::empty(),
        }
    }

    /// A SEND of `sgl`.
    pub fn send(sgl: impl Into<Sgl>) -> UlpWr {
        UlpWr::new(UlpOp::Send, sgl)
    }

    /// A SEND of `data`, copied into the WR at post time (inline; at most
    /// the QP's `max_inline_data`).
    pub fn send_inline(data: &[u8]) -> UlpWr {
        let mut wr = UlpWr::new(UlpOp::Send, Sgl::default());
        wr.inline = Some(InlineData::from_slice(data));
        wr.flags |= SendFlags::INLINE;
        wr
    }

    /// An RDMA WRITE of `sgl` to `remote`.
    pub fn write(sgl: impl Into<Sgl>, remote: RemoteAddr) -> UlpWr {
        UlpWr::new(UlpOp::Write(remote), sgl)
    }

    /// An RDMA READ of `remote` into `sgl`.
    pub fn read(sgl: impl Into<Sgl>, remote: RemoteAddr) -> UlpWr {
        UlpWr::new(UlpOp::Read(remote), sgl)
    }

    /// With `IBV_SEND_FENCE`: the WR waits for earlier READs and atomics
    /// (the layer also keeps it behind READs it has queued).
    pub fn fence(mut self) -> UlpWr {
        self.flags |= SendFlags::FENCE;
        self
    }

    /// With the solicited-event bit.
    pub fn solicited(mut self) -> UlpWr {
        self.flags |= SendFlags::SOLICITED;
        self
    }

    /// Whether the WR takes one of the QP's READ/atomic credits.
    pub fn is_rd_atomic(&self) -> bool {
        matches!(&self.kind, WrKind::Op(op) if op.is_rd_atomic())
    }

    /// Whether the WR is fenced.
    pub fn is_fenced(&self) -> bool {
        self.flags.contains(SendFlags::FENCE) || matches!(self.kind, WrKind::LocalInv { .. })
    }

    pub(crate) fn reg_mr(mr: Arc<Mr>, key: u32, access: AccessFlags) -> UlpWr {
        UlpWr {
            kind: WrKind::RegMr { mr, key, access },
            sgl: Sgl::default(),
            frmr_sge: None,
            frmr: None,
            inline: None,
            flags: SendFlags::empty(),
        }
    }

    pub(crate) fn local_inv(key: u32) -> UlpWr {
        UlpWr {
            kind: WrKind::LocalInv { key },
            sgl: Sgl::default(),
            frmr_sge: None,
            frmr: None,
            inline: None,
            flags: SendFlags::empty(),
        }
    }

    /// What the WR must keep alive once posted: at most one MR (an
    /// operation over one buffer, or over inline data, which was copied),
    /// or the whole WR.
    pub(crate) fn into_kept(self) -> Kept {
        if !matches!(self.kind, WrKind::Op(_)) || self.frmr.is_some() {
            return Kept::Whole(self);
        }
        match self.sgl.0 {
            SglRepr::One(b) => Kept::Mr(b.mr.into_kept()),
            SglRepr::Many(mut v) if v.len() <= 1 => Kept::Mr(v.pop().and_then(|b| b.mr.into_kept())),
            sgl => Kept::Whole(UlpWr { sgl: Sgl(sgl), ..self }),
        }
    }

    /// Appends the WR's scatter entries to `out`: its local scatter list,
    /// its entry over a fast-registration MR or its inline data. A REG_MR
    /// or LOCAL_INV carries none (its buffers are only kept alive with
    /// it, and must not count against the QP's `max_send_sge`).
    pub(crate) fn push_sges<'a, A: smallvec::Array<Item = Sge<'a>>>(&'a self, out: &mut smallvec::SmallVec<A>) {
        if !matches!(self.kind, WrKind::Op(_)) {
            return;
        }
        if let Some((addr, len, key)) = self.frmr_sge {
            // SAFETY: the range is the mapping of the fast-registration MR
            // `self.frmr`, which this WR keeps alive, and that mapping
            // covers MRs this WR's request keeps alive (`sgl` of the chain
            // that registered it) until every WR of the request has
            // retired; the key is the one the chain's REG_MR, posted
            // before this WR, gives it. Registered memory is only accessed
            // by copies (never Rust references).
            out.push(unsafe { Sge::from_raw(addr, len, key) });
            return;
        }
        if let Some(data) = &self.inline {
            out.push(Sge::inline(data));
            return;
        }
        out.extend(self.sgl.iter().map(LocalBuf::sge));
    }

    /// A plain WR (see [`Chain::into_plain`]) taken apart, by value;
    /// any other comes back.
    #[inline(always)]
    #[allow(
        clippy::result_large_err,
        reason = "the WR comes back by value to the general path; a box would allocate for every chain"
    )]
    fn into_plain(self) -> std::result::Result<(Plain, Option<Arc<Mr>>), UlpWr> {
        match self {
            UlpWr {
                kind: WrKind::Op(op),
                sgl: Sgl(SglRepr::One(b)),
                frmr_sge: None,
                frmr: None,
                inline: None,
                flags,
            } if !op.is_rd_atomic() && !flags.contains(SendFlags::FENCE) => {
                let plain = Plain {
                    op,
                    flags,
                    sge_addr: b.sge_addr,
                    lkey: b.lkey,
                    len: b.len,
                };
                Ok((plain, b.mr.into_kept()))
            }
            w => Err(w),
        }
    }

    /// The verbs work request over `sges` (from [`UlpWr::sges`]).
    pub(crate) fn send_wr<'a>(&'a self, wr_id: u64, sges: &'a [Sge<'a>], signaled: bool) -> SendWr<'a> {
        let op = match &self.kind {
            WrKind::Op(op) => op.send_op(),
            WrKind::RegMr { mr, key, access } => SendOp::RegMr {
                mr,
                key: *key,
                access: *access,
            },
            WrKind::LocalInv { key } => SendOp::LocalInv { key: *key },
        };
        let mut flags = self.flags;
        if signaled {
            flags |= SendFlags::SIGNALED;
        }
        SendWr::new(wr_id, op, sges).flags(flags)
    }
}

/// A plain WR over one buffer taken apart ([`Chain::into_plain`]).
pub(crate) struct Plain {
    op: UlpOp,
    flags: SendFlags,
    sge_addr: u64,
    lkey: u32,
    len: u32,
}

impl Plain {
    /// The verbs entry, as the buffer checked it at construction (valid
    /// while the buffer's MR, taken out with it, lives).
    #[inline]
    pub(crate) fn sge(&self) -> Sge<'_> {
        Sge::checked(self.sge_addr, self.len, self.lkey)
    }

    /// The verbs work request over `sges` (from [`Plain::sge`]).
    #[inline]
    pub(crate) fn send_wr<'a>(&'a self, wr_id: u64, sges: &'a [Sge<'a>], signaled: bool) -> SendWr<'a> {
        let mut flags = self.flags;
        if signaled {
            flags |= SendFlags::SIGNALED;
        }
        SendWr::new(wr_id, self.op.send_op(), sges).flags(flags)
    }
}

/// The work requests of one request, posted together: one WR kept
/// inline (the common case: posting it allocates nothing), or any number
/// in a `Vec`. Built from a [`UlpWr`] or a `Vec<UlpWr>` wherever the
/// layer takes one ([`UlpQp::post`](super::UlpQp::post)).
///
/// # Examples
///
/// ```
/// # use std::sync::Arc;
/// use softverbs::ulp::{Chain, LocalBuf, UlpWr};
/// # use softverbs::verbs::{AccessFlags, RemoteAddr};
/// # let pd = softverbs::soft::embedded_default()?[0].open()?.alloc_pd()?;
/// let mr = Arc::new(pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
/// let remote = RemoteAddr { addr: 0x1000, rkey: 7 };
/// let one: Chain = UlpWr::write(LocalBuf::new(&mr, 0, 8)?, remote).into();
/// let two: Chain = vec![UlpWr::send_inline(b"a"), UlpWr::send_inline(b"b")].into();
/// assert_eq!((one.len(), two.len()), (1, 2));
/// # Ok::<(), softverbs::verbs::Error>(())
/// ```
#[derive(Default)]
pub struct Chain(ChainRepr);

enum ChainRepr {
    One(UlpWr),
    Many(Vec<UlpWr>),
}

impl Default for ChainRepr {
    fn default() -> Self {
        ChainRepr::Many(Vec::new())
    }
}

impl Chain {
    /// The WRs, in posting order.
    pub fn as_slice(&self) -> &[UlpWr] {
        match &self.0 {
            ChainRepr::One(w) => std::slice::from_ref(w),
            ChainRepr::Many(v) => v,
        }
    }

    /// A chain of one plain WR (an operation that is neither a READ nor
    /// an atomic, not fenced, with no inline data and no fast-registration
    /// entry, over one buffer) taken apart: what posting its WR needs
    /// (small, by value) and all the request must keep alive, the buffer's
    /// MR (nothing for a `'static` MR). The layer posts such a chain
    /// without its general path (no READ credit, no backlog). Any other
    /// chain comes back as it was.
    #[inline(always)]
    #[allow(
        clippy::result_large_err,
        reason = "the chain comes back by value to the general path; a box would allocate for every chain"
    )]
    pub(crate) fn into_plain(self) -> std::result::Result<(Plain, Option<Arc<Mr>>), Chain> {
        match self.0 {
            ChainRepr::One(w) => w.into_plain().map_err(|w| Chain(ChainRepr::One(w))),
            ChainRepr::Many(mut v) if v.len() == 1 => {
                let w = v.pop().expect("one WR");
                w.into_plain().map_err(|w| {
                    v.push(w);
                    Chain(ChainRepr::Many(v))
                })
            }
            repr => Err(Chain(repr)),
        }
    }

    /// The WR of a chain of one kept inline, or the `Vec`.
    pub(crate) fn into_one(self) -> std::result::Result<UlpWr, Vec<UlpWr>> {
        match self.0 {
            ChainRepr::One(w) => Ok(w),
            ChainRepr::Many(mut v) if v.len() == 1 => Ok(v.pop().expect("one WR")),
            ChainRepr::Many(v) => Err(v),
        }
    }
}

impl std::ops::Deref for Chain {
    type Target = [UlpWr];
    fn deref(&self) -> &[UlpWr] {
        self.as_slice()
    }
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl From<UlpWr> for Chain {
    fn from(w: UlpWr) -> Chain {
        Chain(ChainRepr::One(w))
    }
}

impl From<Vec<UlpWr>> for Chain {
    fn from(v: Vec<UlpWr>) -> Chain {
        Chain(ChainRepr::Many(v))
    }
}
