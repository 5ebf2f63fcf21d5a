//! Process faults for a spawned `cursorlog` (or any) child: freeze it with `SIGSTOP`, thaw it
//! with `SIGCONT`, kill it with `SIGKILL`.
//!
//! [`pause`] and [`resume`] return only once every thread of the process is stopped (or none
//! is): the signal is delivered asynchronously (each thread stops on its next return to user
//! space), so the helpers poll `/proc/<pid>/task/*/stat` until the state is reached. Linux only.
//!
//! A paused process still holds its sockets: the kernel completes TCP handshakes and buffers
//! requests, but nothing answers, as for a process stuck in a long GC pause or a frozen VM.
//! Resume it before [`crate::Server::terminate`] (SIGTERM waits behind SIGSTOP); dropping the
//! [`crate::Server`] or [`crate::Server::kill`] works on a paused process (SIGKILL does).
//!
//! To kill a [`crate::Server`], use [`crate::Server::kill`]: it sends SIGKILL and also reaps
//! the child. [`kill_hard`] is the bare signal, for a pid the harness holds no `Server` for;
//! whoever owns the child must still reap it.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

/// How long [`pause`] and [`resume`] wait for the process to reach the state.
pub const STATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the state is read while waiting (a poll of `/proc`, which sends no event).
const POLL: Duration = Duration::from_millis(1);

/// A process fault that could not be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FaultError {
    /// The pid is 0 or does not fit a `pid_t`.
    #[error("{pid} is not a process id")]
    InvalidPid {
        /// The pid given.
        pid: u32,
    },
    /// `kill(2)` failed (`ESRCH`: no such process; `EPERM`: not ours).
    #[error("sending {signal} to process {pid}")]
    Signal {
        /// The process.
        pid: u32,
        /// The signal's name.
        signal: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// `/proc/<pid>/...` could not be read or parsed (the process may have exited).
    #[error("reading the state of process {pid}")]
    State {
        /// The process.
        pid: u32,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The process did not reach the state in time.
    #[error("process {pid} was not {wanted} within {waited:?} (thread states: {states})")]
    Timeout {
        /// The process.
        pid: u32,
        /// "stopped" or "running".
        wanted: &'static str,
        /// How long it was given.
        waited: Duration,
        /// Its threads' last states, one letter each.
        states: String,
    },
}

/// Freezes process `pid` (`SIGSTOP`) and returns once every thread of it is stopped.
///
/// # Errors
/// [`FaultError::InvalidPid`], [`FaultError::Signal`], [`FaultError::State`] or
/// [`FaultError::Timeout`] after [`STATE_TIMEOUT`].
pub fn pause(pid: u32) -> Result<(), FaultError> {
    signal(pid, Signal::STOP, "SIGSTOP")?;
    wait_for(pid, "stopped", |states| {
        states.iter().all(|&s| s == 'T' || is_dead(s))
    })
}

/// Thaws process `pid` (`SIGCONT`) and returns once no thread of it is stopped.
///
/// # Errors
/// As [`pause`].
pub fn resume(pid: u32) -> Result<(), FaultError> {
    signal(pid, Signal::CONT, "SIGCONT")?;
    wait_for(pid, "running", |states| !states.contains(&'T'))
}

/// Sends `SIGKILL` to process `pid` (no shutdown path runs). Does not reap it: prefer
/// [`crate::Server::kill`] for a `Server`.
///
/// # Errors
/// [`FaultError::InvalidPid`] or [`FaultError::Signal`].
pub fn kill_hard(pid: u32) -> Result<(), FaultError> {
    signal(pid, Signal::KILL, "SIGKILL")
}

/// Whether process `pid` is stopped: every thread in state `T`.
///
/// # Errors
/// [`FaultError::State`] when `/proc` cannot be read (the process is gone, or not Linux).
pub fn is_stopped(pid: u32) -> Result<bool, FaultError> {
    let states = thread_states(pid)?;
    Ok(states.iter().all(|&s| s == 'T' || is_dead(s)))
}

/// The state letter of every thread of process `pid` (`R` running, `S` sleeping, `T` stopped,
/// ...), from `/proc/<pid>/task/*/stat`.
///
/// # Errors
/// [`FaultError::State`] when `/proc` cannot be read or parsed.
pub fn thread_states(pid: u32) -> Result<Vec<char>, FaultError> {
    let state_error = |source| FaultError::State { pid, source };
    let tasks = Path::new("/proc").join(pid.to_string()).join("task");
    let mut states = Vec::new();
    for entry in std::fs::read_dir(tasks).map_err(state_error)? {
        let stat = match std::fs::read_to_string(entry.map_err(state_error)?.path().join("stat")) {
            Ok(stat) => stat,
            // A thread that exited between the listing and the read.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(state_error(e)),
        };
        states.push(parse_state(&stat).ok_or_else(|| {
            state_error(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no state in {stat:?}"),
            ))
        })?);
    }
    if states.is_empty() {
        return Err(state_error(io::Error::new(
            io::ErrorKind::NotFound,
            "no threads",
        )));
    }
    Ok(states)
}

/// The state field of a `stat` line: the first field after the command name, which is in
/// parentheses and may itself contain spaces and parentheses.
fn parse_state(stat: &str) -> Option<char> {
    let (_, after_comm) = stat.rsplit_once(')')?;
    after_comm.trim_start().chars().next()
}

/// A zombie or dead thread: it will never stop or run again, so it does not block either state.
fn is_dead(state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x')
}

fn signal(pid: u32, signal: Signal, name: &'static str) -> Result<(), FaultError> {
    let target = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or(FaultError::InvalidPid { pid })?;
    kill_process(target, signal).map_err(|errno| FaultError::Signal {
        pid,
        signal: name,
        source: errno.into(),
    })
}

fn wait_for(
    pid: u32,
    wanted: &'static str,
    reached: impl Fn(&[char]) -> bool,
) -> Result<(), FaultError> {
    let deadline = Instant::now() + STATE_TIMEOUT;
    loop {
        let states = thread_states(pid)?;
        if reached(&states) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(FaultError::Timeout {
                pid,
                wanted,
                waited: STATE_TIMEOUT,
                states: states.into_iter().collect(),
            });
        }
        // Polling is the only way to observe another process's state change; this is the
        // poll interval, not a guess at when the state is reached.
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::{Child, Command};

    use super::*;

    /// A child killed (and reaped) when the test ends, pass or fail.
    struct Sleeper(Child);

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn sleeper() -> Sleeper {
        Sleeper(Command::new("sleep").arg("30").spawn().unwrap())
    }

    /// The main thread's state, straight from `/proc/<pid>/stat`.
    fn stat_state(pid: u32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        parse_state(&stat).unwrap()
    }

    #[test]
    fn pause_stops_and_resume_continues_a_real_child() {
        let child = sleeper();
        let pid = child.0.id();
        pause(pid).unwrap();
        assert_eq!(stat_state(pid), 'T');
        assert!(is_stopped(pid).unwrap());
        // Pausing twice is harmless.
        pause(pid).unwrap();
        resume(pid).unwrap();
        let state = stat_state(pid);
        assert_ne!(state, 'T', "still stopped after resume");
        assert!(!is_stopped(pid).unwrap());
    }

    #[test]
    fn kill_hard_kills_even_a_paused_child() {
        let mut child = sleeper();
        let pid = child.0.id();
        pause(pid).unwrap();
        kill_hard(pid).unwrap();
        let status = child.0.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }

    #[test]
    fn faults_on_a_missing_process_are_typed_errors() {
        // Above any pid_max: never a live process (a reaped child's pid could be reused, and
        // the test would then stop a stranger).
        let missing = i32::MAX.unsigned_abs();
        assert!(matches!(pause(missing), Err(FaultError::Signal { .. })));
        assert!(matches!(is_stopped(missing), Err(FaultError::State { .. })));
        assert!(matches!(resume(0), Err(FaultError::InvalidPid { pid: 0 })));
        assert!(matches!(
            kill_hard(u32::MAX),
            Err(FaultError::InvalidPid { .. })
        ));
    }

    #[test]
    fn the_state_is_read_after_the_last_parenthesis() {
        assert_eq!(parse_state("42 (a) b) (c) T 1 2"), Some('T'));
        assert_eq!(parse_state("42 (sleep) S 1 42"), Some('S'));
        assert_eq!(parse_state("garbage"), None);
    }
}
