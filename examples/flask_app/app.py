"""A Flask app whose signup view enqueues a job in the same transaction as its INSERT.

    export RUNLEDGER_DATABASE_URL=postgresql://app@localhost/app
    flask --app examples/flask_app/app.py runledger migrate
    flask --app examples/flask_app/app.py run
    flask --app examples/flask_app/app.py runledger worker
"""

import os

import sqlalchemy as sa
from flask import Flask, request

from flask_app.jobs import registry
from runledger_sync.contrib.flask import Runledger

app = Flask(__name__)
app.config["RUNLEDGER_DATABASE_URL"] = os.environ.get("RUNLEDGER_DATABASE_URL")  # else SQLALCHEMY_DATABASE_URI
app.config["RUNLEDGER_AUTOSTART_WORKER"] = False   # True: a worker inside the web process
runledger = Runledger(app, registry)

metadata = sa.MetaData()
users = sa.Table(
    "users", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("email", sa.Text, nullable=False, unique=True),
    sa.Column("welcomed_at", sa.DateTime(timezone=True)),
)
with app.app_context():
    metadata.create_all(runledger.engine)   # the example's own table; your app has its own migrations


@app.post("/signup")
def signup():
    email = request.form["email"]
    try:
        with runledger.engine.begin() as conn:   # one transaction: the user and the job commit together
            user_id = conn.execute(users.insert().values(email=email).returning(users.c.id)).scalar_one()
            job = runledger.enqueue("email.welcome", {"email": email}, connection=conn)
    except sa.exc.IntegrityError:            # that e-mail already signed up: no user, no job
        return {"error": "email already registered"}, 409
    return {"user_id": user_id, "job_id": str(job.id)}, 201
