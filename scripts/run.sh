#!/usr/bin/env bash
# `make run`: a complete local Outbox on the embedded SQLite database.
# Migrates, loads demo/config.json, issues a demo site key, starts the processes and
# prints how to send a first notification. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
SMTP_PORT=${SMTP_PORT:-2525}
# DEBUG stays off unless you set it: Django's debug pages show submitted bodies and settings.
mkdir -p var/mail var/log

echo "==> Migrating the database (${DATABASE_URL:-SQLite var/outbox.sqlite3})"
$PY manage.py migrate --noinput -v0

$PY manage.py collectstatic --noinput -v0

echo "==> Loading the demo configuration (demo/config.json)"
$PY manage.py outbox_config import demo/config.json
if [ "$SMTP_PORT" != 2525 ]; then
  # The demo configuration names the catcher's default port; follow SMTP_PORT instead.
  $PY manage.py shell -v 0 -c "
from notifications.models import SmtpConfiguration
SmtpConfiguration.objects.filter(host='127.0.0.1').update(port=$SMTP_PORT)"
fi

KEYFILE=var/demo-site-key
if [ -s "$KEYFILE" ] && $PY manage.py shell -v 0 -c "
import sys; from sites.models import SiteAPIKey
sys.exit(0 if SiteAPIKey.objects.is_valid(open('$KEYFILE').read().strip()) else 1)" 2>/dev/null; then
  echo "==> Reusing the demo site key in $KEYFILE"
else
  echo "==> Issuing a key for site demo-site (saved in $KEYFILE)"
  $PY manage.py create_site_key demo-site --name "make run demo" 2>/dev/null | tail -n 1 > "$KEYFILE"
fi
KEY=$(cat "$KEYFILE")

PASSFILE=var/admin-password
if [ ! -s "$PASSFILE" ]; then
  $PY -c "import secrets; print(secrets.token_urlsafe(12))" > "$PASSFILE"
fi
ADMIN_PASSWORD=$(cat "$PASSFILE")
$PY manage.py shell -v 0 -c "
from django.contrib.auth import get_user_model
User = get_user_model()
user, _ = User.objects.get_or_create(username='admin', defaults={'is_staff': True, 'is_superuser': True})
user.is_staff = user.is_superuser = True
user.set_password('$ADMIN_PASSWORD'); user.save()"

pids=()
stop() {
  echo; echo "==> Stopping"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait || true
}
trap stop INT TERM EXIT

echo "==> Starting the SMTP catcher on 127.0.0.1:$SMTP_PORT (messages saved in var/mail/)"
$PY manage.py smtp_catcher --host 127.0.0.1 --port "$SMTP_PORT" --maildir var/mail > var/log/smtp.log 2>&1 &
pids+=($!)

echo "==> Starting the worker (django-q2 qcluster; log in var/log/worker.log)"
$PY manage.py qcluster > var/log/worker.log 2>&1 &
pids+=($!)

echo "==> Starting the web server on http://$HOST:$PORT (log in var/log/web.log)"
# gunicorn.conf.py (project root) names the application and the worker class.
$PY -m gunicorn --bind "$HOST:$PORT" --workers 2 --access-logfile - > var/log/web.log 2>&1 &
pids+=($!)

for _ in $(seq 1 50); do
  if $PY -c "import urllib.request,sys; urllib.request.urlopen('http://$HOST:$PORT/healthz', timeout=1)" 2>/dev/null; then
    break
  fi
  sleep 0.2
done

ID=$($PY -c "import uuid; print(uuid.uuid4())")
cat <<MSG

Outbox is running.
  API:    http://$HOST:$PORT/api/v1/   (schema: /api/v1/schema/)
  Admin:  http://$HOST:$PORT/admin/    user admin, password $ADMIN_PASSWORD
  Mail:   every email the demo SMTP catcher receives is saved under var/mail/

Send a first notification (site demo-site, list Operators):

  curl -sS -X POST http://$HOST:$PORT/api/v1/notifications/ \\
    -H "Authorization: Api-Key $KEY" -H "Content-Type: application/json" \\
    -d '{"notification_id": "$ID", "list_name": "Operators", "subject": "Pump 3 tripped", "body": "Overcurrent at 10:00"}'

Within a second or two the email is in var/mail/ and its status is Delivered:

  curl -sS http://$HOST:$PORT/api/v1/notifications/$ID/ -H "Authorization: Api-Key $KEY"

Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}"
echo "A process exited; see var/log/. Stopping the others."
