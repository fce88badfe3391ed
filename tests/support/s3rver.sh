# Sourced by test scripts: starts s3rver (a local S3 API, npm) on a free loopback port with
# one bucket and, in front of it, s3_verify_proxy.py, which refuses any request whose AWS
# SigV4 signature is wrong (s3rver accepts any); stops both by PID. After start_s3rver DIR
# BUCKET: S3_ENDPOINT (the proxy: nothing should talk to s3rver directly), S3RVER_PID and
# S3_PROXY_PID are set and the AWS_* variables hold the credentials the proxy checks
# against. Logs: DIR/s3rver.log, DIR/s3_proxy.log (one line per refused request). The
# caller's EXIT trap calls stop_s3rver.
s3rver_support_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

find_s3rver() {
  local s=${JUMBO_S3RVER:-}
  [[ -z $s && -x $HOME/.cache/jumbo/npm/node_modules/.bin/s3rver ]] &&
    s=$HOME/.cache/jumbo/npm/node_modules/.bin/s3rver
  [[ -z $s ]] && s=$(command -v s3rver || true)
  [[ -n $s && -x $s ]] || return 1
  echo "$s"
}

start_s3rver() {
  local dir=$1 bucket=$2 s3rver port
  s3rver=$(find_s3rver) || {
    echo "s3rver not found (JUMBO_S3RVER, ~/.cache/jumbo/npm, PATH): run scripts/install-deps.sh" >&2
    return 1
  }
  # s3rver makes ListObjectsV2 continuation tokens with DES, which OpenSSL 3 keeps in its
  # legacy provider: without it any truncated listing is a 500.
  if node --openssl-legacy-provider -e 0 2>/dev/null; then
    export NODE_OPTIONS="--openssl-legacy-provider${NODE_OPTIONS:+ $NODE_OPTIONS}"
  fi
  # A port nothing listens on now (the kernel's pick); s3rver binds it a moment later.
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
  mkdir -p "$dir"
  "$s3rver" -d "$dir/data" -p "$port" -a 127.0.0.1 --configure-bucket "$bucket" \
    >"$dir/s3rver.log" 2>&1 &
  S3RVER_PID=$!
  local up=
  for _ in $(seq 150); do  # 15 s
    kill -0 "$S3RVER_PID" 2>/dev/null || break
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then up=1; break; fi
    sleep 0.1
  done
  if [[ -z $up ]]; then
    echo "s3rver did not answer on 127.0.0.1:$port within 15 s; its log:" >&2
    cat "$dir/s3rver.log" >&2
    return 1
  fi
  # The proxy picks its own port and writes it to a file once it accepts connections.
  rm -f "$dir/s3_proxy.port"
  # The first python3 with botocore: PATH's, else Debian's (python3-botocore).
  local py
  for py in python3 /usr/bin/python3; do
    "$py" -c 'import botocore' 2>/dev/null && break
  done
  "$py" "$s3rver_support_dir/s3_verify_proxy.py" --upstream "http://127.0.0.1:$port" \
    --port-file "$dir/s3_proxy.port" --access-key S3RVER --secret-key S3RVER \
    --region us-east-1 --bucket "$bucket" 2>"$dir/s3_proxy.log" &
  S3_PROXY_PID=$!
  for _ in $(seq 100); do  # 10 s
    [[ -s $dir/s3_proxy.port ]] && break
    kill -0 "$S3_PROXY_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [[ ! -s $dir/s3_proxy.port ]]; then
    echo "s3_verify_proxy.py did not start within 10 s; its log:" >&2
    cat "$dir/s3_proxy.log" >&2
    return 1
  fi
  S3_ENDPOINT=http://127.0.0.1:$(cat "$dir/s3_proxy.port")
  export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1
  export AWS_EC2_METADATA_DISABLED=true
  unset AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_DEFAULT_REGION
}

stop_s3rver() {
  if [[ -n ${S3_PROXY_PID:-} ]]; then
    kill "$S3_PROXY_PID" 2>/dev/null || true
    wait "$S3_PROXY_PID" 2>/dev/null || true
    S3_PROXY_PID=
  fi
  if [[ -n ${S3RVER_PID:-} ]]; then
    kill "$S3RVER_PID" 2>/dev/null || true
    wait "$S3RVER_PID" 2>/dev/null || true
    S3RVER_PID=
  fi
}
