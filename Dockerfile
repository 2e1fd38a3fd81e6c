# One image for all five services: `tessera <service>` picks which.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY tools/__init__.py tools/localcluster.py ./tools/
RUN pip install --no-cache-dir . && useradd --uid 10001 tessera
USER 10001
ENTRYPOINT ["tessera"]
