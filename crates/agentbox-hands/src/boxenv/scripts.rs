//! The fixed scripts `BoxEnv` runs, one per operation. Paths and values are arguments
//! (`$1`, `$2`…), never part of the text. They need POSIX sh and GNU coreutils, findutils
//! and util-linux; they run with `LC_ALL=C`, so a failure's text is the kernel's strerror,
//! which [`super::code_of`] maps to the same codes the host's errno gives.

/// `stat` format for one path: kind|size|mtime with milliseconds.
pub(crate) const INFO: &str = r#"exec stat -c '%F|%s|%.3Y' -- "$1""#;

pub(crate) const READ: &str = r#"exec cat -- "$1""#;

/// `head -n 0` never reads, so a directory is refused first, as a read would refuse it.
pub(crate) const READ_LINES: &str = r#"[ -d "$1" ] && { echo "head: $1: Is a directory" >&2; exit 1; }
exec head -n "$2" -- "$1""#;

/// A reader's checks, as the host's reader makes them: the lstat line, refused when a link
/// (with no_follow `$3` = 1), a directory or over the bound `$2`. One text for both scripts
/// below, so the reader of a box without live processes checks exactly what the others do.
macro_rules! reader_checks {
    () => {
        r#"info=$(stat -c '%F|%s|%.3Y' -- "$1") || exit 1
case $info in "symbolic link|"*) [ "$3" = 1 ] && { echo "agentbox:symlink" >&2; exit 3; } ;; esac
size=$(stat -L -c '%s' -- "$1") || exit 1
[ -d "$1" ] && { echo "cat: $1: Is a directory" >&2; exit 1; }
[ "$size" -le "$2" ] || { echo "agentbox:too_large $size" >&2; exit 4; }
printf '%s\n' "$info""#
    };
}

/// The lstat line, then the bytes; refused before a byte moves when a link (with no_follow)
/// or over the bound.
pub(crate) const OPEN_READER: &str = concat!(reader_checks!(), "\n", r#"exec cat -- "$1""#);

/// [`OPEN_READER`]'s checks and lstat line alone: a box without live processes moves the
/// bytes by download, which its output (text) could not carry exactly.
pub(crate) const READER_CHECKS: &str = reader_checks!();

pub(crate) const WRITE: &str = r#"mkdir -p -- "$(dirname -- "$1")" 2>/dev/null; exec tee -- "$1" >/dev/null"#;

pub(crate) const APPEND: &str = r#"mkdir -p -- "$(dirname -- "$1")" 2>/dev/null; exec tee -a -- "$1" >/dev/null"#;

pub(crate) const TRUNCATE: &str = r#"stat -L -c '' -- "$1" >/dev/null || exit 1; exec truncate -c -s "$2" -- "$1""#;

pub(crate) const FLUSH: &str = r#"exec sync -- "$1""#;

/// rename(2), failing the way the kernel fails it where `mv -T` would refuse in its own
/// words: a source that is an ancestor of the target is EINVAL, a target that is an ancestor
/// of the source ENOTEMPTY, a non-directory onto a directory EISDIR. The same file is no
/// error: the same inode as lstat(2) reads it (a link to the target is not the target, as
/// rename(2) sees it). Paths arrive absolute and folded; their parents are resolved as the kernel would.
pub(crate) const RENAME: &str = r#"a=$(stat -c %d:%i -- "$1" 2>/dev/null) && [ "$a" = "$(stat -c %d:%i -- "$2" 2>/dev/null)" ] && exit 0
stat -L -c '' -- "${1%/*}/" >/dev/null || exit 1
stat -L -c '' -- "${2%/*}/" >/dev/null || exit 1
if [ -e "$1" ] || [ -L "$1" ]; then
  s="$(realpath -m -- "${1%/*}/")/${1##*/}"
  d="$(realpath -m -- "${2%/*}/")/${2##*/}"
  case "$d/" in "$s"/*) echo "mv: $2: Invalid argument" >&2; exit 1 ;; esac
  case "$s/" in "$d"/*) echo "mv: $2: Directory not empty" >&2; exit 1 ;; esac
  if [ -d "$2" ] && [ ! -L "$2" ] && { [ ! -d "$1" ] || [ -L "$1" ]; }; then
    echo "mv: $2: Is a directory" >&2; exit 1
  fi
fi
exec mv -T -- "$1" "$2""#;

/// Entries NUL-separated: name, type letter, size, mtime seconds with fraction.
pub(crate) const LIST: &str = r#"k=$(stat -L -c '%F' -- "$1") || exit 1
[ "$k" = directory ] || { echo "agentbox:not_directory $1: Not a directory" >&2; exit 1; }
exec find "$1/" -mindepth 1 -maxdepth 1 -printf '%f\0%y\0%s\0%T@\0'"#;

/// The kernel resolves the path first (`stat -L`): GNU realpath 9.1 never ends on a link that
/// names itself through `.` (`b -> b/./b`: each turn makes the path longer, so its loop check
/// never sees a repeat) where the kernel answers ELOOP.
pub(crate) const CANONICAL: &str = r#"stat -L -c '' -- "$1" >/dev/null || exit 1
exec realpath -e -z -- "$1""#;

pub(crate) const READ_LINK: &str = r#"stat -c '' -- "$1" >/dev/null || exit 1
readlink -z -- "$1" || { echo "agentbox:invalid $1: Invalid argument (not a symbolic link)" >&2; exit 1; }"#;

/// Exit 0 and `yes` or `no`; a failure other than a missing path is an error.
pub(crate) const EXISTS: &str = r#"if err=$(stat -c '' -- "$1" 2>&1 >/dev/null); then echo yes; exit 0; fi
case $err in *"No such file or directory"*|*"Not a directory"*) echo no; exit 0 ;; esac
echo "$err" >&2; exit 1"#;

pub(crate) const MKDIR: &str = r#"exec mkdir -- "$1""#;
pub(crate) const MKDIR_P: &str = r#"exec mkdir -p -- "$1""#;

/// `$2` is `rf`, `r`, `f` or `-` (no flag).
pub(crate) const REMOVE: &str = r#"case $2 in
  rf) exec rm -rf -- "$1" ;;
  r) exec rm -r -- "$1" ;;
  f) exec rm -f -- "$1" ;;
  *) exec rm -- "$1" ;;
esac"#;

pub(crate) const TEMP_DIR: &str = r#"exec mktemp -d -p "${TMPDIR:-/tmp}" "$1XXXXXX""#;
pub(crate) const TEMP_FILE: &str = r#"exec mktemp -p "${TMPDIR:-/tmp}" --suffix="$2" "$1XXXXXX""#;

/// Every path under each target: path, type, size, mtime (NUL-separated). `$1` is the max
/// depth (`-1` for the whole subtree), the rest are the targets.
pub(crate) const SNAPSHOT: &str = r#"d=$1; shift
for t in "$@"; do
  if [ "$d" = -1 ]; then find "$t" -printf '%p\0%y\0%s\0%T@\0' 2>/dev/null
  else find "$t" -maxdepth "$d" -printf '%p\0%y\0%s\0%T@\0' 2>/dev/null; fi
done; exit 0"#;

/// Starts [`COMMAND`] (its text is `$1`) in a session of its own and waits for it. This shell
/// parks its own stdout and stderr, so nothing it might print (dash reports a child a signal
/// ended) reaches the command's streams; the subshell restores them and `exec`s `setsid`,
/// which, in a process that is not a group leader (a forked child never is), takes the new
/// session in place. The exit is the command's, 128 + the signal for a signalled one.
pub(crate) const OUTER: &str = r#"w=$1; shift
exec 3>&2 4>&1 1>/dev/null 2>/dev/null
( exec 1>&4 2>&3 3>&- 4>&-; exec setsid sh -c "$w" agentbox-cmd "$@" )
exit $?"#;

/// Runs a command in a process group of its own (started by [`OUTER`]). Writes a header
/// line on stdout first: `\0agentbox-cmd <pgid>`, or `nocwd`, `noprog`, `noshell`, then
/// `exec`s the command, so the group's leader is the command itself and no shell waits on it
/// (a waiting dash would print "Terminated" into the command's own stderr). The group is
/// written down as `$TMPDIR/.agentbox-hands/<pgid>` holding the leader's start time, so a
/// later kill never reaches a reused pid; files of groups that ended are swept here and by
/// [`END_LEFT`]. `$1` is `shell` or `argv`, `$2` the working directory, the rest the
/// command. The caller's PATH arrives as AGENTBOX_CALLER_PATH so these lines keep the box's
/// own search path.
pub(crate) const COMMAND: &str = r#"mode=$1; cwd=$2; shift 2
T="${TMPDIR:-/tmp}/.agentbox-hands"
shbin=$(command -v bash || command -v sh)
[ -n "$shbin" ] || { printf '\000agentbox-cmd noshell\n'; exit 127; }
cd -- "$cwd" 2>/dev/null || { printf '\000agentbox-cmd nocwd\n'; exit 126; }
if [ "$mode" = argv ]; then
  ( [ -n "${AGENTBOX_CALLER_PATH+x}" ] && PATH=$AGENTBOX_CALLER_PATH; command -v -- "$1" >/dev/null 2>&1 ) ||
    { printf '\000agentbox-cmd noprog\n'; exit 127; }
fi
started() { read -r l < "/proc/$1/stat" || return 1; r=${l##*) }; set -- $r; echo "${20}"; }
if mkdir -p "$T" 2>/dev/null; then
  for f in "$T"/*; do [ -f "$f" ] && [ ! -d "/proc/${f##*/}" ] && rm -f "$f"; done
  started $$ > "$T/$$"
fi
if [ "${AGENTBOX_NOINHERIT-}" = 1 ]; then
  names=$(export -p | while IFS= read -r l; do
    case $l in "export "*|"declare -x "*) n=${l#export }; n=${n#declare -x }; n=${n%%=*}
      case $n in ""|*[!A-Za-z0-9_]*) ;; *) echo "$n" ;; esac ;; esac; done)
  keep=" $AGENTBOX_KEEP AGENTBOX_CALLER_PATH "
  for n in $names; do
    case $keep in *" $n "*) ;; *) unset "$n" 2>/dev/null ;; esac
  done
  PATH=/usr/local/bin:/usr/bin:/bin
fi
[ -n "${AGENTBOX_CALLER_PATH+x}" ] && PATH=$AGENTBOX_CALLER_PATH
export PATH
unset AGENTBOX_CALLER_PATH AGENTBOX_NOINHERIT AGENTBOX_KEEP T l r f n names cwd keep
unset -f started
printf '\000agentbox-cmd %s\n' "$$"
if [ "$mode" = shell ]; then exec "$shbin" -c "$1"; else exec "$@"; fi"#;

/// Ask group `$1` to end, kill it a second later, and say whether a live process of it is
/// left (`gone` or `alive`). A zombie does not count.
pub(crate) const KILL_GROUP: &str = r#"g=$1
alive() {
  for s in /proc/[0-9]*/stat; do
    read -r l < "$s" 2>/dev/null || continue
    r=${l##*) }; set -- $r
    [ "$3" = "$g" ] && [ "$1" != Z ] && [ "$1" != X ] && return 0
  done
  return 1
}
kill -s TERM -- "-$g" 2>/dev/null
i=0; while [ $i -lt 10 ] && alive; do sleep 0.1; i=$((i+1)); done
kill -s KILL -- "-$g" 2>/dev/null
i=0; while [ $i -lt 20 ] && alive; do sleep 0.05; i=$((i+1)); done
if alive; then echo alive; else rm -f "${TMPDIR:-/tmp}/.agentbox-hands/$g"; echo gone; fi"#;

/// Kill every group an environment wrote down whose leader is still the process it wrote
/// down (same start time), and forget every file. Prints the groups it killed.
pub(crate) const END_LEFT: &str = r#"T="${TMPDIR:-/tmp}/.agentbox-hands"
for f in "$T"/*; do
  [ -f "$f" ] || continue
  g=${f##*/}
  case $g in ""|*[!0-9]*) continue ;; esac
  want=$(cat "$f" 2>/dev/null)
  if read -r l < "/proc/$g/stat" 2>/dev/null; then
    r=${l##*) }; set -- $r
    if [ "${20}" = "$want" ]; then kill -s KILL -- "-$g" 2>/dev/null && echo "$g"; fi
  fi
  rm -f "$f"
done; exit 0"#;

/// Runs `"$@"` with none of the box's variables: only those named in `AGENTBOX_KEEP` (the
/// caller's), and PATH the caller's (`AGENTBOX_CALLER_PATH`) or a default one. The one command
/// over a runner that goes through a script: `inherit_env` false, which the runner cannot
/// give. Only builtins run before the `exec`.
pub(crate) const CLEAN_ENV: &str = r#"p=${AGENTBOX_CALLER_PATH-/usr/local/bin:/usr/bin:/bin}
names=$(export -p | while IFS= read -r l; do
  case $l in "export "*|"declare -x "*) n=${l#export }; n=${n#declare -x }; n=${n%%=*}
    case $n in ""|*[!A-Za-z0-9_]*) ;; *) echo "$n" ;; esac ;; esac; done)
keep=" $AGENTBOX_KEEP "
for n in $names; do
  case $keep in *" $n "*) ;; *) unset "$n" 2>/dev/null ;; esac
done
unset AGENTBOX_KEEP AGENTBOX_CALLER_PATH
PATH=$p; export PATH
unset p names keep n l
exec "$@""#;

pub(crate) const REMOVE_ALL: &str = r#"exec rm -rf -- "$@""#;

// What a box without live processes runs (`one_call.rs`): each is one call that answers once
// it ended, takes no input and no variables, so bytes go by upload and download and these
// carry only paths.

/// A temporary directory under `$1` (made first), named `$2XXXXXX`: under the workspace, the
/// one place an upload reaches.
pub(crate) const TEMP_DIR_IN: &str = r#"mkdir -p -- "$1" || exit 1; exec mktemp -d -p "$1" "$2XXXXXX""#;

/// A temporary file under `$1` (made first), named `$2XXXXXX$3`.
pub(crate) const TEMP_FILE_IN: &str = r#"mkdir -p -- "$1" || exit 1; exec mktemp -p "$1" --suffix="$3" "$2XXXXXX""#;

/// Append the file `$2` (the bytes, uploaded to a file of their own) to `$1`, creating `$1`
/// and its parents, then remove `$2` whatever happened. One command, so a command the box runs
/// before or after it keeps its own change to `$1`; `tee` opens `$1`, so a failure is in GNU's
/// words.
pub(crate) const APPEND_FROM: &str = r#"mkdir -p -- "$(dirname -- "$1")" 2>/dev/null
tee -a -- "$1" < "$2" >/dev/null; s=$?
rm -f -- "$2"
exit $s"#;

/// Why a download of `$1` failed, in the words a read's own open gives (a directory, no such
/// file, a file on the way, no permission): opens it and reads nothing. Exit 0 when it can be
/// read now, so the download's own error stands.
pub(crate) const WHY_NOT_READ: &str = r#"[ -d "$1" ] && { echo "cat: $1: Is a directory" >&2; exit 1; }
exec head -c 0 -- "$1""#;

/// Why an upload to `$1` failed, in the words a write's own open gives: makes the parents as a
/// write does, then opens `$1` for append and writes nothing. A file that was not there is
/// removed again, so a write that failed leaves none. Exit 0 when it can be written now.
pub(crate) const WHY_NOT_WRITTEN: &str = r#"mkdir -p -- "$(dirname -- "$1")" 2>/dev/null
if [ -e "$1" ] || [ -L "$1" ]; then exec tee -a -- "$1" </dev/null >/dev/null; fi
tee -a -- "$1" </dev/null >/dev/null || exit 1
exec rm -f -- "$1""#;

/// Runs a command in a box without live processes, as one call: no session, nothing written
/// down, nothing to kill (nothing reaches a running call; the call's own deadline ends it).
/// Writes a header line on stdout first: `\0agentbox-cmd run`, or `nocwd`, `noprog`,
/// `noshell`, then `exec`s the command. `$1` is `shell` or `argv`, `$2` the working
/// directory, `$3` `clean` (none of the box's variables, a default PATH: `inherit_env` false)
/// or `keep`, the rest the command. The caller's variables never arrive: such a box takes none.
pub(crate) const ONE_CALL: &str = r#"mode=$1; cwd=$2; vars=$3; shift 3
shbin=$(command -v bash || command -v sh)
[ -n "$shbin" ] || { printf '\000agentbox-cmd noshell\n'; exit 127; }
cd -- "$cwd" 2>/dev/null || { printf '\000agentbox-cmd nocwd\n'; exit 126; }
if [ "$vars" = clean ]; then
  names=$(export -p | while IFS= read -r l; do
    case $l in "export "*|"declare -x "*) n=${l#export }; n=${n#declare -x }; n=${n%%=*}
      case $n in ""|*[!A-Za-z0-9_]*) ;; *) echo "$n" ;; esac ;; esac; done)
  for n in $names; do unset "$n" 2>/dev/null; done
  PATH=/usr/local/bin:/usr/bin:/bin; export PATH
fi
if [ "$mode" = argv ]; then
  command -v -- "$1" >/dev/null 2>&1 || { printf '\000agentbox-cmd noprog\n'; exit 127; }
fi
printf '\000agentbox-cmd run\n'
if [ "$mode" = shell ]; then exec "$shbin" -c "$1"; else exec "$@"; fi"#;
