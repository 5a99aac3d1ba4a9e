# Helpers shared by the launch scripts (sourced, not executed).
# shellcheck shell=bash

# Prints one argument so that bash reads it back unchanged: bare when it is made of
# characters the shell leaves alone, else single-quoted (an option's value alone:
# --command='...').
quote_arg() {
  local arg=$1
  if [[ -n $arg && $arg =~ ^[A-Za-z0-9_./:=@%+,-][A-Za-z0-9_./:=@%+,~-]*$ ]]; then
    printf '%s' "$arg"
  elif [[ $arg =~ ^(--[A-Za-z0-9-]+=)(.*)$ ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
    quote_arg "${BASH_REMATCH[2]}"
  else
    printf "'%s'" "${arg//\'/\'\\\'\'}"
  fi
}

# Prints a command line: every argument quoted with quote_arg, separated by spaces.
quote_command() {
  local out="" arg
  for arg in "$@"; do
    out+="${out:+ }$(quote_arg "$arg")"
  done
  printf '%s\n' "$out"
}

# Fails with exit code 2 (bad usage) and a message saying what to set.
usage_error() {
  printf '%s: error: %s\n' "$(basename "$0")" "$1" >&2
  exit 2
}

# Checks that an option has a value (not the next option): `need_value --zone "$#" "${2-}"`.
need_value() {
  if (( $2 < 2 )) || [[ -z $3 || $3 == --* ]]; then
    usage_error "$1 needs a value"
  fi
}
