"""A FastAPI app whose signup endpoint enqueues a job in the same transaction as its INSERT.

    export RUNLEDGER_DATABASE_URL=postgresql://app@localhost/app
    cd examples
    runledger-sync migrate --app fastapi_app.jobs:registry
    uvicorn fastapi_app.app:app
    runledger-sync worker --app fastapi_app.jobs:registry
"""

import os
from contextlib import asynccontextmanager
from uuid import UUID

import sqlalchemy as sa
from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import create_async_engine

import runledger_sync as rl
from runledger_sync import aio

# One setting for the app and the worker; the app talks to it through psycopg 3's async driver.
url = sa.make_url(os.environ["RUNLEDGER_DATABASE_URL"]).set(drivername="postgresql+psycopg_async")
engine = create_async_engine(url)

metadata = sa.MetaData()
users = sa.Table(
    "users", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("email", sa.Text, nullable=False, unique=True),
    sa.Column("welcomed_at", sa.DateTime(timezone=True)),
)


@asynccontextmanager
async def lifespan(app: FastAPI):
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)   # the example's own table; your app has its own migrations
    yield
    await engine.dispose()


app = FastAPI(lifespan=lifespan)


class Signup(BaseModel):
    email: str


@app.post("/signup", status_code=201)
async def signup(body: Signup) -> dict:
    try:
        async with engine.begin() as conn:   # one transaction: the user and the job commit together
            user = await conn.execute(users.insert().values(email=body.email).returning(users.c.id))
            user_id = user.scalar_one()
            job = await aio.enqueue(conn, "email.welcome", {"email": body.email})
    except sa.exc.IntegrityError:            # that e-mail already signed up: no user, no job
        raise HTTPException(409, "email already registered") from None
    return {"user_id": user_id, "job_id": str(job.id)}


@app.get("/jobs/{job_id}")
async def job_status(job_id: UUID, wait: float = Query(0, ge=0, le=60)) -> dict:
    """The job's status now; with ?wait=N, once it has ended or N seconds have passed."""
    try:
        job = await aio.wait_for_job(engine, job_id, timeout=wait)
    except rl.JobWaitTimeout as not_yet:
        return {"status": not_yet.details["status"], "output": None}
    except rl.JobNotFound:
        raise HTTPException(404, "no such job") from None
    return {"status": job.status.value, "output": job.output}
