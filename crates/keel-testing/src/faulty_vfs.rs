//! A SQLite VFS that injects I/O errors on write and fsync.
//!
//! The file system of a test machine rarely lets a test make `fsync` fail
//! (that takes device-mapper or the kernel's fault injection), so this VFS
//! does it one level up: registered under [`VFS_NAME`], it wraps SQLite's
//! default VFS and forwards every call, except that while a [`FaultRule`]
//! is armed, matching `xWrite` calls fail with `SQLITE_IOERR_WRITE` and
//! matching `xSync` calls with `SQLITE_IOERR_FSYNC`, without touching the
//! file. Open a store with `SqliteOptions { vfs: Some(VFS_NAME.into()), .. }`
//! after [`register`].
//!
//! Rules are process-global (SQLite's VFS is), so each one is scoped to the
//! files under a directory: tests running in parallel, each in its own
//! temporary directory, do not see each other's faults.
//!
//! The injected fault is the one SQLite sees: the write or sync did not
//! happen. It does not model the kernel dropping dirty pages after a failed
//! `fsync` (the data of an earlier, successful `write` stays in the page
//! cache and reaches the disk later).
//!
//! This module holds the crate's only `unsafe` code: the C ABI of a VFS
//! cannot be written without it.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rusqlite::ffi;

/// The name the VFS is registered under.
pub const VFS_NAME: &str = "keel-faulty";

const VFS_NAME_C: &CStr = c"keel-faulty";

/// The VFS could not be registered.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FaultyVfsError {
    /// SQLite has no default VFS to wrap.
    #[error("SQLite has no default VFS")]
    NoDefaultVfs,
    /// `sqlite3_vfs_register` failed with this result code.
    #[error("sqlite3_vfs_register failed with code {0}")]
    Register(c_int),
}

/// Which file operation a rule fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    /// `xWrite`, failing with `SQLITE_IOERR_WRITE`.
    Write,
    /// `xSync` (fsync), failing with `SQLITE_IOERR_FSYNC`.
    Sync,
}

/// What to fail: one operation, on the files under a directory (and,
/// optionally, only those whose path ends with a suffix), every time or
/// only the next `n` times.
#[derive(Debug, Clone)]
pub struct FaultRule {
    op: FaultOp,
    under: PathBuf,
    suffix: Option<String>,
    after: u64,
    times: Option<u64>,
}

impl FaultRule {
    /// Fails every `op` on a file under `under` while armed. SQLite names
    /// files by their full path with symbolic links resolved, so `under`
    /// is resolved too where it exists.
    pub fn every(op: FaultOp, under: impl Into<PathBuf>) -> Self {
        let under = under.into();
        Self {
            op,
            under: std::fs::canonicalize(&under).unwrap_or(under),
            suffix: None,
            after: 0,
            times: None,
        }
    }

    /// Lets the first `calls` matching calls through before failing any: a
    /// write fault then lands in the middle of a transaction.
    pub fn after(mut self, calls: u64) -> Self {
        self.after = calls;
        self
    }

    /// Fails only the next `times` matching calls, then lets calls through.
    pub fn times(mut self, times: u64) -> Self {
        self.times = Some(times);
        self
    }

    /// Fails only files whose path ends with `suffix` (`"-wal"` for the
    /// write-ahead log, `".sqlite3"` for a main database file).
    pub fn ending_with(mut self, suffix: impl Into<String>) -> Self {
        self.suffix = Some(suffix.into());
        self
    }

    fn matches(&self, op: FaultOp, path: &str) -> bool {
        self.op == op
            && Path::new(path).starts_with(&self.under)
            && self.suffix.as_deref().is_none_or(|suffix| path.ends_with(suffix))
    }
}

/// An armed rule. Dropping it (or [`Armed::disarm`]) clears the fault.
#[derive(Debug)]
pub struct Armed {
    id: u64,
    injected: Arc<AtomicU64>,
}

impl Armed {
    /// How many calls this rule has failed so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// Clears the fault; returns how many calls it failed.
    pub fn disarm(self) -> u64 {
        self.injected()
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        let mut rules = plan().lock().unwrap_or_else(|poison| poison.into_inner());
        rules.retain(|rule| rule.id != self.id);
        ARMED.store(rules.len(), Ordering::SeqCst);
    }
}

struct Active {
    id: u64,
    rule: FaultRule,
    /// Matching calls still to let through before failing.
    skip: u64,
    remaining: Option<u64>,
    injected: Arc<AtomicU64>,
}

/// The armed rules of the process.
fn plan() -> &'static Mutex<Vec<Active>> {
    static PLAN: OnceLock<Mutex<Vec<Active>>> = OnceLock::new();
    PLAN.get_or_init(|| Mutex::new(Vec::new()))
}

/// How many rules are armed: lets the I/O path skip the lock when none is.
static ARMED: AtomicUsize = AtomicUsize::new(0);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Faults injected since the process started, of every rule.
static INJECTED_WRITES: AtomicU64 = AtomicU64::new(0);
static INJECTED_SYNCS: AtomicU64 = AtomicU64::new(0);

/// Arms `rule` until the returned guard is dropped.
pub fn arm(rule: FaultRule) -> Armed {
    let injected = Arc::new(AtomicU64::new(0));
    let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
    let mut rules = plan().lock().unwrap_or_else(|poison| poison.into_inner());
    rules.push(Active {
        id,
        skip: rule.after,
        remaining: rule.times,
        rule,
        injected: Arc::clone(&injected),
    });
    ARMED.store(rules.len(), Ordering::SeqCst);
    Armed { id, injected }
}

/// Faults injected since the process started: `(writes, syncs)`.
pub fn injected_total() -> (u64, u64) {
    (
        INJECTED_WRITES.load(Ordering::SeqCst),
        INJECTED_SYNCS.load(Ordering::SeqCst),
    )
}

/// Whether the call `op` on `path` is to fail; counts it if so.
fn should_fail(op: FaultOp, path: Option<&str>) -> bool {
    if ARMED.load(Ordering::SeqCst) == 0 {
        return false;
    }
    let Some(path) = path else { return false };
    let mut rules = plan().lock().unwrap_or_else(|poison| poison.into_inner());
    for active in rules.iter_mut() {
        if !active.rule.matches(op, path) || active.remaining == Some(0) {
            continue;
        }
        if active.skip > 0 {
            active.skip -= 1;
            continue;
        }
        if let Some(remaining) = &mut active.remaining {
            *remaining -= 1;
        }
        active.injected.fetch_add(1, Ordering::SeqCst);
        let total = match op {
            FaultOp::Write => &INJECTED_WRITES,
            FaultOp::Sync => &INJECTED_SYNCS,
        };
        total.fetch_add(1, Ordering::SeqCst);
        return true;
    }
    false
}

/// Registers the VFS (once per process; later calls return the first
/// outcome). It is not made the default.
pub fn register() -> Result<&'static str, FaultyVfsError> {
    static REGISTERED: OnceLock<Result<(), FaultyVfsError>> = OnceLock::new();
    REGISTERED.get_or_init(register_once).clone().map(|()| VFS_NAME)
}

fn register_once() -> Result<(), FaultyVfsError> {
    // SAFETY: `sqlite3_vfs_find(NULL)` initializes SQLite if needed and
    // returns its default VFS, which lives as long as the process (VFSes
    // are never unregistered here).
    let real = unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) };
    if real.is_null() {
        return Err(FaultyVfsError::NoDefaultVfs);
    }
    // SAFETY: `real` is a valid, registered VFS (checked non-null above).
    let real_vfs = unsafe { &*real };
    let vfs = ffi::sqlite3_vfs {
        iVersion: real_vfs.iVersion,
        szOsFile: real_vfs.szOsFile + HEADER as c_int,
        mxPathname: real_vfs.mxPathname,
        pNext: std::ptr::null_mut(),
        zName: VFS_NAME_C.as_ptr(),
        pAppData: real.cast(),
        xOpen: Some(x_open),
        xDelete: real_vfs.xDelete.map(|_| x_delete as _),
        xAccess: real_vfs.xAccess.map(|_| x_access as _),
        xFullPathname: real_vfs.xFullPathname.map(|_| x_full_pathname as _),
        xDlOpen: real_vfs.xDlOpen.map(|_| x_dl_open as _),
        xDlError: real_vfs.xDlError.map(|_| x_dl_error as _),
        xDlSym: real_vfs.xDlSym.map(|_| x_dl_sym as _),
        xDlClose: real_vfs.xDlClose.map(|_| x_dl_close as _),
        xRandomness: real_vfs.xRandomness.map(|_| x_randomness as _),
        xSleep: real_vfs.xSleep.map(|_| x_sleep as _),
        xCurrentTime: real_vfs.xCurrentTime.map(|_| x_current_time as _),
        xGetLastError: real_vfs.xGetLastError.map(|_| x_get_last_error as _),
        xCurrentTimeInt64: real_vfs.xCurrentTimeInt64.map(|_| x_current_time_int64 as _),
        xSetSystemCall: real_vfs.xSetSystemCall.map(|_| x_set_system_call as _),
        xGetSystemCall: real_vfs.xGetSystemCall.map(|_| x_get_system_call as _),
        xNextSystemCall: real_vfs.xNextSystemCall.map(|_| x_next_system_call as _),
    };
    // The VFS must outlive every connection: it is leaked, once.
    let vfs = Box::into_raw(Box::new(vfs));
    // SAFETY: `vfs` is a fully initialized VFS that is never freed; SQLite
    // keeps the pointer, and only reads it.
    let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(FaultyVfsError::Register(rc))
    }
}

/// The file of this VFS: this header, then the wrapped VFS's file.
///
/// SQLite allocates `szOsFile` bytes (the wrapped VFS's size plus
/// [`HEADER`]) and hands the pointer to `xOpen`; the wrapped file starts
/// right after the header.
#[repr(C)]
struct FaultyFile {
    /// What SQLite sees: its `pMethods` is one of [`METHODS`].
    base: ffi::sqlite3_file,
    /// The file's path (`None` for a temporary file without a name), owned:
    /// made by `Box::into_raw` in `xOpen`, freed in `xClose`.
    path: *mut String,
}

/// The header's size, rounded up so the wrapped file is 8-byte aligned.
const HEADER: usize = std::mem::size_of::<FaultyFile>().next_multiple_of(8);

/// The wrapped VFS, kept in our VFS's `pAppData`.
///
/// # Safety
/// `vfs` must be the VFS [`register_once`] registered.
unsafe fn real_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: per the contract, `vfs` is ours and `pAppData` the wrapped VFS.
    unsafe { (*vfs).pAppData.cast() }
}

/// The wrapped VFS's file inside ours.
///
/// # Safety
/// `file` must be a file of this VFS (allocated with our `szOsFile`).
unsafe fn real_file(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: the allocation is `HEADER` + the wrapped file's size bytes.
    unsafe { file.cast::<u8>().add(HEADER).cast() }
}

/// The methods of the wrapped file (non-null once it opened).
///
/// # Safety
/// `file` must be a file of this VFS that opened successfully.
unsafe fn real_methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: an opened file's methods are a static table of the wrapped VFS.
    unsafe { &*(*real_file(file)).pMethods }
}

/// The path the file was opened with.
///
/// # Safety
/// `file` must be a file of this VFS that opened successfully.
unsafe fn path_of<'a>(file: *mut ffi::sqlite3_file) -> Option<&'a str> {
    // SAFETY: `path` is null or a live `Box<String>` until `xClose`.
    unsafe { (*file.cast::<FaultyFile>()).path.as_ref().map(String::as_str) }
}

/// Our io methods, one table per `iVersion` (1 to 3): a file gets the
/// table of the wrapped file's version, so SQLite calls only what the
/// wrapped file has.
static METHODS: [ffi::sqlite3_io_methods; 3] = [io_methods(1), io_methods(2), io_methods(3)];

const fn io_methods(version: c_int) -> ffi::sqlite3_io_methods {
    ffi::sqlite3_io_methods {
        iVersion: version,
        xClose: Some(x_close),
        xRead: Some(x_read),
        xWrite: Some(x_write),
        xTruncate: Some(x_truncate),
        xSync: Some(x_sync),
        xFileSize: Some(x_file_size),
        xLock: Some(x_lock),
        xUnlock: Some(x_unlock),
        xCheckReservedLock: Some(x_check_reserved_lock),
        xFileControl: Some(x_file_control),
        xSectorSize: Some(x_sector_size),
        xDeviceCharacteristics: Some(x_device_characteristics),
        xShmMap: Some(x_shm_map),
        xShmLock: Some(x_shm_lock),
        xShmBarrier: Some(x_shm_barrier),
        xShmUnmap: Some(x_shm_unmap),
        xFetch: Some(x_fetch),
        xUnfetch: Some(x_unfetch),
    }
}

// The VFS methods. SQLite calls each with our VFS; each forwards to the
// wrapped VFS (in `pAppData`), whose method exists: ours is set only where
// the wrapped one is.

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite passes our VFS and a file of `szOsFile` bytes; the
    // header is written before anything reads it, and the wrapped VFS
    // opens its file in the bytes after the header. `name` is null or a
    // NUL-terminated path that outlives the call.
    unsafe {
        let real = real_vfs(vfs);
        let path = if name.is_null() {
            std::ptr::null_mut()
        } else {
            Box::into_raw(Box::new(CStr::from_ptr(name).to_string_lossy().into_owned()))
        };
        file.cast::<FaultyFile>().write(FaultyFile {
            base: ffi::sqlite3_file {
                pMethods: std::ptr::null(),
            },
            path,
        });
        let inner = real_file(file);
        (*inner).pMethods = std::ptr::null();
        let Some(open) = (*real).xOpen else {
            drop_path(file);
            return ffi::SQLITE_CANTOPEN;
        };
        let rc = open(real, name, inner, flags, out_flags);
        if (*inner).pMethods.is_null() {
            // Nothing to close: SQLite will not call `xClose`.
            drop_path(file);
        } else {
            // SQLite calls `xClose` whenever `pMethods` is set, even after
            // a failed open; the wrapped file needs it then too.
            let version = (*(*inner).pMethods).iVersion.clamp(1, 3);
            (*file).pMethods = &METHODS[(version - 1) as usize];
        }
        rc
    }
}

/// Frees the path of a file.
///
/// # Safety
/// `file` must be a file of this VFS whose header `xOpen` wrote; the path
/// must not be used afterwards.
unsafe fn drop_path(file: *mut ffi::sqlite3_file) {
    // SAFETY: `path` is null or came from `Box::into_raw`; it is nulled so
    // it cannot be freed twice.
    unsafe {
        let header = file.cast::<FaultyFile>();
        let path = (*header).path;
        (*header).path = std::ptr::null_mut();
        if !path.is_null() {
            drop(Box::from_raw(path));
        }
    }
}

/// Forwards a VFS method: `forward_vfs!(vfs, xName, args…)` calls the
/// wrapped VFS's `xName` with the wrapped VFS and `args`.
macro_rules! forward_vfs {
    ($vfs:expr, $method:ident, $fallback:expr $(, $arg:expr)*) => {{
        // SAFETY: SQLite calls with our VFS; the wrapped VFS is valid for
        // the process, and the arguments are SQLite's, passed on unchanged.
        unsafe {
            let real = real_vfs($vfs);
            match (*real).$method {
                Some(method) => method(real $(, $arg)*),
                None => $fallback,
            }
        }
    }};
}

unsafe extern "C" fn x_delete(vfs: *mut ffi::sqlite3_vfs, name: *const c_char, sync_dir: c_int) -> c_int {
    forward_vfs!(vfs, xDelete, ffi::SQLITE_IOERR_DELETE, name, sync_dir)
}

unsafe extern "C" fn x_access(vfs: *mut ffi::sqlite3_vfs, name: *const c_char, flags: c_int, out: *mut c_int) -> c_int {
    forward_vfs!(vfs, xAccess, ffi::SQLITE_IOERR_ACCESS, name, flags, out)
}

unsafe extern "C" fn x_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n_out: c_int,
    out: *mut c_char,
) -> c_int {
    forward_vfs!(vfs, xFullPathname, ffi::SQLITE_CANTOPEN, name, n_out, out)
}

unsafe extern "C" fn x_dl_open(vfs: *mut ffi::sqlite3_vfs, name: *const c_char) -> *mut c_void {
    forward_vfs!(vfs, xDlOpen, std::ptr::null_mut(), name)
}

unsafe extern "C" fn x_dl_error(vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) {
    forward_vfs!(vfs, xDlError, (), n, out)
}

type DlSym = Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>;

unsafe extern "C" fn x_dl_sym(vfs: *mut ffi::sqlite3_vfs, handle: *mut c_void, symbol: *const c_char) -> DlSym {
    forward_vfs!(vfs, xDlSym, None, handle, symbol)
}

unsafe extern "C" fn x_dl_close(vfs: *mut ffi::sqlite3_vfs, handle: *mut c_void) {
    forward_vfs!(vfs, xDlClose, (), handle)
}

unsafe extern "C" fn x_randomness(vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    forward_vfs!(vfs, xRandomness, 0, n, out)
}

unsafe extern "C" fn x_sleep(vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    forward_vfs!(vfs, xSleep, 0, micros)
}

unsafe extern "C" fn x_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    forward_vfs!(vfs, xCurrentTime, ffi::SQLITE_ERROR, out)
}

unsafe extern "C" fn x_get_last_error(vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    forward_vfs!(vfs, xGetLastError, 0, n, out)
}

unsafe extern "C" fn x_current_time_int64(vfs: *mut ffi::sqlite3_vfs, out: *mut ffi::sqlite3_int64) -> c_int {
    forward_vfs!(vfs, xCurrentTimeInt64, ffi::SQLITE_ERROR, out)
}

unsafe extern "C" fn x_set_system_call(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    call: ffi::sqlite3_syscall_ptr,
) -> c_int {
    forward_vfs!(vfs, xSetSystemCall, ffi::SQLITE_NOTFOUND, name, call)
}

unsafe extern "C" fn x_get_system_call(vfs: *mut ffi::sqlite3_vfs, name: *const c_char) -> ffi::sqlite3_syscall_ptr {
    forward_vfs!(vfs, xGetSystemCall, None, name)
}

unsafe extern "C" fn x_next_system_call(vfs: *mut ffi::sqlite3_vfs, name: *const c_char) -> *const c_char {
    forward_vfs!(vfs, xNextSystemCall, std::ptr::null(), name)
}

// The io methods. SQLite calls them only on a file whose `pMethods` is one
// of our tables, that is one `xOpen` opened; each forwards to the wrapped
// file, whose table has every method its `iVersion` promises.

/// Forwards an io method: `forward_io!(file, xName, fallback, args…)` calls
/// the wrapped file's `xName` with the wrapped file and `args`, or gives
/// `fallback` where the wrapped file has no such method.
macro_rules! forward_io {
    ($file:expr, $method:ident, $fallback:expr $(, $arg:expr)*) => {{
        // SAFETY: SQLite calls with a file this VFS opened; its wrapped file
        // is open and its methods valid. The arguments are passed on.
        unsafe {
            let real = real_file($file);
            match real_methods($file).$method {
                Some(method) => method(real $(, $arg)*),
                None => $fallback,
            }
        }
    }};
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let rc = forward_io!(file, xClose, ffi::SQLITE_OK);
    // SAFETY: SQLite calls `xClose` once per opened file and does not use
    // the file afterwards.
    unsafe { drop_path(file) };
    rc
}

unsafe extern "C" fn x_read(file: *mut ffi::sqlite3_file, buf: *mut c_void, amount: c_int, offset: i64) -> c_int {
    forward_io!(file, xRead, ffi::SQLITE_IOERR_READ, buf, amount, offset)
}

unsafe extern "C" fn x_write(file: *mut ffi::sqlite3_file, buf: *const c_void, amount: c_int, offset: i64) -> c_int {
    // SAFETY: `file` was opened by `xOpen`, so its header is initialized.
    if should_fail(FaultOp::Write, unsafe { path_of(file) }) {
        return ffi::SQLITE_IOERR_WRITE;
    }
    forward_io!(file, xWrite, ffi::SQLITE_IOERR_WRITE, buf, amount, offset)
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    forward_io!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: `file` was opened by `xOpen`, so its header is initialized.
    if should_fail(FaultOp::Sync, unsafe { path_of(file) }) {
        return ffi::SQLITE_IOERR_FSYNC;
    }
    forward_io!(file, xSync, ffi::SQLITE_IOERR_FSYNC, flags)
}

unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    forward_io!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward_io!(file, xLock, ffi::SQLITE_IOERR_LOCK, level)
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward_io!(file, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level)
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    forward_io!(file, xCheckReservedLock, ffi::SQLITE_IOERR_CHECKRESERVEDLOCK, out)
}

unsafe extern "C" fn x_file_control(file: *mut ffi::sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    forward_io!(file, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    forward_io!(file, xSectorSize, 4096)
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    forward_io!(file, xDeviceCharacteristics, 0)
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward_io!(file, xShmMap, ffi::SQLITE_IOERR_SHMMAP, region, size, extend, out)
}

unsafe extern "C" fn x_shm_lock(file: *mut ffi::sqlite3_file, offset: c_int, n: c_int, flags: c_int) -> c_int {
    forward_io!(file, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, offset, n, flags)
}

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    forward_io!(file, xShmBarrier, ())
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    forward_io!(file, xShmUnmap, ffi::SQLITE_OK, delete)
}

unsafe extern "C" fn x_fetch(file: *mut ffi::sqlite3_file, offset: i64, amount: c_int, out: *mut *mut c_void) -> c_int {
    // SAFETY: as in `forward_io!`; `out` is SQLite's, valid for a write.
    unsafe {
        match real_methods(file).xFetch {
            Some(fetch) => fetch(real_file(file), offset, amount, out),
            None => {
                // No memory map: SQLite reads instead.
                *out = std::ptr::null_mut();
                ffi::SQLITE_OK
            }
        }
    }
}

unsafe extern "C" fn x_unfetch(file: *mut ffi::sqlite3_file, offset: i64, page: *mut c_void) -> c_int {
    forward_io!(file, xUnfetch, ffi::SQLITE_OK, offset, page)
}

#[cfg(test)]
mod tests;
