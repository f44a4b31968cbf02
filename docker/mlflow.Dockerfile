# syntax=docker/dockerfile:1
# The MLflow tracking server of the compose stack: the locked mlflow, the Postgres driver for its backend
# store and boto3 for its artifact store on MinIO (the official image has neither). Build from the
# repository root:
#   docker build -f docker/mlflow.Dockerfile -t pretrain-mlflow:0.1.0 .
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
COPY requirements.lock docker/requirements-services.lock /tmp/
# mlflow and the server's drivers at their locked versions; the lock constrains every dependency.
ARG MLFLOW_VERSION=3.17.2
ARG PSYCOPG2_BINARY_VERSION=2.9.13
ARG BOTO3_VERSION=1.44.8
RUN pip install --no-cache-dir -c /tmp/requirements.lock -c /tmp/requirements-services.lock \
        "mlflow==${MLFLOW_VERSION}" "psycopg2-binary==${PSYCOPG2_BINARY_VERSION}" "boto3==${BOTO3_VERSION}" \
    && pip check

FROM python:${PYTHON_VERSION}-slim-bookworm
RUN useradd --create-home --uid 10001 --user-group mlflow
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /home/mlflow
USER 10001:10001
EXPOSE 5000
ENTRYPOINT ["mlflow"]
CMD ["server", "--host", "0.0.0.0", "--port", "5000"]
